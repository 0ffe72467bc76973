#!/usr/bin/env bash
# device_check.sh - rlx's Vulkan backend on a real GPU, in one prepared script: build rlx, run the
# Vulkan parity suite on the GPU (its own subgroup size, separate device memory: the staged
# path for real), then time prefill and decode beside llama.cpp's own Vulkan build on the same
# GGUF files (benchmarks/device_check.py).
#
# NOT YET RUN: written for this project's lent GPU machines (an NVIDIA H200, no network, Python
# 3.12 with numpy and pytest, no Vulkan SDK) while none was lent; every step says what it did.
#
#   benchmarks/device_check.sh prepare     here, with network: packages the GPU machine lacks, as
#                                          .debs and wheels under .devcheck/ (git-ignored locally)
#   benchmarks/device_check.sh [run]       there: carry .devcheck (and .devcheck/llama.cpp, a
#                                          llama.cpp source tree, to time it too); results go to
#                                          $OUT (the device tool's folder) or benchmarks/results
#   STEPS="build parity bench llama"       which steps run (default all; llama only with sources)
#
# A run of every step but llama takes about 5 minutes on 16 cores (build 1-2, parity 1-2, GGUF
# files and timings 2); building llama.cpp with -DGGML_VULKAN=ON takes another 5, so give it a
# second run (STEPS=llama) if the first is short of time. Exit status: non-zero if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEV=$ROOT/.devcheck
OUT=${OUT:-$ROOT/benchmarks/results/device_check}
STEPS=${STEPS:-build parity bench llama}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$OUT"

# Debian 12 packages rlx's build and the Vulkan tests need that a CUDA image lacks.
DEBS="libvulkan1 libvulkan-dev glslc libshaderc1 spirv-tools vulkan-validationlayers libopenblas0
      libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5 libssl-dev"
WHEELS="gguf==0.17.1"   # GGUF writer of benchmarks/device_check.py (pure Python)

if [ "${1:-run}" = prepare ]; then
    set -e
    mkdir -p "$DEV/debs" "$DEV/whl"
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qx '/.devcheck/' "$exclude" 2>/dev/null || echo '/.devcheck/' >> "$exclude"
    (cd "$DEV/debs" && apt-get download $DEBS)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$DEV/whl" $WHEELS
    du -sh "$DEV"
    echo "carry .devcheck (and .devcheck/llama.cpp, a llama.cpp source tree, to time llama.cpp too)"
    exit 0
fi

status=()
step() { printf '\n==================== %s ====================\n' "$1"; }
record() { local name=$1; shift; status+=("$name: $*"); }
wants() { [[ " $STEPS " == *" $1 "* ]]; }

# ---- the machine's packages: unpack what it lacks (libraries the image has are left alone) --------
if [ -d "$DEV/debs" ]; then
    for deb in "$DEV"/debs/*.deb; do
        pkg=$(basename "$deb" | cut -d_ -f1)
        case $pkg in
        libvulkan1|libgfortran5|libshaderc1|libopenblas0*) # runtime libraries: only when missing
            lib=$(dpkg -c "$deb" | grep -o '[^/]*\.so\.[0-9]*$' | head -1)
            ldconfig -p | grep -q "$lib" || dpkg -x "$deb" / ;;
        *) dpkg -x "$deb" / ;;
        esac
    done
    ldconfig
fi
if [ -d "$DEV/whl" ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$DEV"/whl/*.whl &&
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# the vendor's Vulkan driver, not lavapipe (the device tool's notes: the NVIDIA ICD's path)
unset VK_DRIVER_FILES VK_ICD_FILENAMES
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -e "$nv" ] && export VK_DRIVER_FILES=$nv
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  command -v vulkaninfo >/dev/null && vulkaninfo --summary 2>&1 | sed -n '/Devices:/,$p' || true
} | tee "$OUT/machine.log"

if wants build; then
    step "build rlx (setup.py build_ext --inplace)"
    "$PYTHON" setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1
    rc=$?; tail -5 "$OUT/build.log"
    "$PYTHON" -c 'import rlx, json; print(rlx.backends()); print(json.dumps(rlx.devices(), indent=1))' \
        2>&1 | tee -a "$OUT/build.log"
    record build $([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")
fi

if wants parity; then
    step "parity on the GPU (validation on where the layer is installed)"
    layer=$(ls /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json 2>/dev/null)
    export RLX_VULKAN_VALIDATION=$([ -n "$layer" ] && echo 1 || echo 0)
    timeout 200 "$PYTHON" -m pytest -q -p no:cacheprovider tests/vulkan 2>&1 | tee "$OUT/parity.log" | tail -70
    rc=${PIPESTATUS[0]}
    timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider tests/unit/test_ops.py tests/unit/test_sequences.py \
        tests/unit/test_generator.py -k vulkan 2>&1 | tee -a "$OUT/parity.log" | tail -5
    rc2=${PIPESTATUS[0]}
    [ $rc -eq 0 ] && rc=$rc2
    cp build/vulkan_parity.json "$OUT/" 2>/dev/null
    record parity $([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")
fi

LLAMA_BENCH=""
if wants llama; then
    step "llama.cpp with its Vulkan backend"
    src=${LLAMA_CPP_SRC:-$DEV/llama.cpp}
    if [ ! -f "$src/CMakeLists.txt" ]; then
        record llama "skipped (no llama.cpp sources at $src)"
    else
        build=$ROOT/benchmarks/.cache/device_check/llama.cpp/build
        timeout 480 cmake -S "$src" -B "$build" -G Ninja -DGGML_VULKAN=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
            -DCMAKE_BUILD_TYPE=Release > "$OUT/llama_build.log" 2>&1 &&
            timeout 480 cmake --build "$build" --target llama-bench -j "$(nproc)" >> "$OUT/llama_build.log" 2>&1
        rc=$?; tail -3 "$OUT/llama_build.log"
        [ $rc -eq 0 ] && LLAMA_BENCH=$build/bin/llama-bench
        record llama $([ $rc -eq 0 ] && echo "built" || echo "FAILED to build ($rc): see llama_build.log")
    fi
fi

if wants bench; then
    step "timings: rlx beside llama.cpp on the same GGUF files"
    timeout 420 "$PYTHON" benchmarks/device_check.py --out "$OUT" ${LLAMA_BENCH:+--llama-bench "$LLAMA_BENCH"} \
        2>&1 | tee "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    record bench $([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")
fi

step "summary"
fail=0
for s in "${status[@]}"; do echo "  $s"; [[ $s == *FAILED* ]] && fail=1; done
exit $fail
