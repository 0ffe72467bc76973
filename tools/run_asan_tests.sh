#!/usr/bin/env bash
# Runs pytest tests/unit tests/bindings against an ASan+UBSan build of rlx._C.
#
#   build/asan/rlx/_C*.so    RLX_SANITIZE=1 build (rebuilt only when csrc/ or setup.py change)
#   build/asan/rlx/**        a copy of the Python package (refreshed every run)
# PYTHONPATH=build/asan makes `import rlx` load that copy; the pytest plugin
# tools/rlx_asan_check.py imports it before any conftest and fails the run if
# rlx._C comes from anywhere else. The in-place build (rlx/_C*.so) is untouched.
#
#   tools/run_asan_tests.sh [PYTEST ARGS...]   default: tests/unit tests/bindings tests/distributed/test_transport.py
#                                              tests/vulkan
# Vulkan (lavapipe, when VK_DRIVER_FILES selects it) runs in the sanitized process like any library;
# leak detection stays off here, so Mesa's memory orphaned when the loader unloads the driver at
# exit (VULKAN.md) needs no LD_PRELOAD of the driver.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-.venv/bin/python}
PYTEST_BIN="$(dirname "$PYTHON")/pytest"   # not `python -m pytest`: that puts ./ (with ./rlx) first on sys.path
OUT=build/asan
TMP=build/asan-tmp

suffix=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
so="$OUT/rlx/_C$suffix"
list="$TMP/csrc-list"

# ---- build (only when something changed) -----------------------------------
mkdir -p "$TMP"
find csrc -type f \( -name '*.c' -o -name '*.h' -o -name '*.inc' -o -name '*.comp' -o -name '*.glsl' -o -name '*.list' \) \
  | LC_ALL=C sort > "$list.new"
stale=0
if [ ! -f "$so" ] || ! cmp -s "$list.new" "$list"; then
  stale=1
elif [ -n "$(find csrc setup.py -newer "$so" -type f -print -quit)" ]; then
  stale=1
fi
if [ $stale = 1 ]; then
  echo "asan: building rlx._C with RLX_SANITIZE=1 into $OUT"
  rm -f "$so"
  RLX_SANITIZE=1 "$PYTHON" setup.py -q build_ext --force --build-lib "$OUT" --build-temp "$TMP"
  touch "$so"
  mv -f "$list.new" "$list"
else
  rm -f "$list.new"
  echo "asan: $so is up to date"
fi

# ---- refresh the Python package copy beside the sanitized .so ---------------
find "$OUT/rlx" -mindepth 1 ! -name "_C$suffix" ! -name "_mpi$suffix" -delete 2>/dev/null || true
tar -C . --exclude='__pycache__' --exclude='*.so' --exclude='*.pyc' -cf - rlx | tar -C "$OUT" -xf -

# ---- sanitizer runtime ------------------------------------------------------
# Python itself is not instrumented, so the ASan runtime must be loaded first.
# libubsan is pulled in by the extension's own DT_NEEDED; preloading it is harmless.
libasan=$(gcc -print-file-name=libasan.so)
libubsan=$(gcc -print-file-name=libubsan.so)
for f in "$libasan" "$libubsan"; do
  [ -e "$f" ] || { echo "asan: sanitizer runtime not found: $f (install gcc)" >&2; exit 1; }
done
libasan=$(readlink -f "$libasan"); libubsan=$(readlink -f "$libubsan")

# A sanitizer error ends the process mid-test. pytest's default fd-level capture
# would swallow the report with it, so capture at sys level only (--capture=sys):
# reports written by C to fd 2 reach the terminal; the plugin records the test.
logs="$ROOT/build/asan-logs"
mkdir -p "$logs"; rm -f "$logs/current-test"
export LD_PRELOAD="$libasan:$libubsan"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export RLX_ASAN_CURRENT_TEST="$logs/current-test"
export PYTHONPATH="$ROOT/$OUT:$ROOT/tools${PYTHONPATH:+:$PYTHONPATH}"
export RLX_ASAN_EXPECT_DIR="$ROOT/$OUT"
# Tests that measure memory (RSS) cannot hold under ASan (freed memory sits in
# its quarantine): they can skip on RLX_ASAN=1, or on "-fsanitize" in
# rlx.build_info()["cflags"].
export RLX_ASAN=1

if [ $# -gt 0 ]; then
  args=("$@")
else
  args=()
  for d in tests/unit tests/bindings tests/distributed/test_transport.py tests/vulkan; do [ -e "$d" ] && args+=("$d"); done
  if [ ${#args[@]} -eq 0 ]; then
    echo "asan: no tests/unit or tests/bindings directory; nothing to run"
    exit 0
  fi
fi

set +e
"$PYTEST_BIN" -p rlx_asan_check -p no:cacheprovider --capture=sys -q "${args[@]}"
rc=$?
set -e
if [ $rc -ne 0 ] && [ $rc -ne 5 ] && [ -s "$RLX_ASAN_CURRENT_TEST" ]; then
  echo "asan: pytest exit $rc; last test started: $(cat "$RLX_ASAN_CURRENT_TEST")"
fi
if [ $rc -eq 5 ]; then
  echo "asan: no tests collected in ${args[*]}; phase skipped"
  exit 0
fi
exit $rc
