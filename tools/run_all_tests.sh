#!/usr/bin/env bash
# The phases of `make test`, in order. Every phase runs even when an earlier one failed, so one
# CI run shows every failure; the exit status is non-zero when any phase failed.
#   [1/7] pytest tests/ but tests/vulkan      (normal build, rlx/_C*.so in place)
#   [2/7] tests/c/test_*.c under valgrind     (tools/run_c_tests.sh)
#   [3/7] pytest tests/unit tests/bindings tests/vulkan against an ASan+UBSan build
#                                             (tools/run_asan_tests.sh)
#   [4/7] tests/c/test_*.c under ThreadSanitizer (tools/run_c_tests.sh --tsan)
#   [5/7] pytest tests/vulkan                 (the Vulkan backend's own suite)
#   [6/7] each fuzz target of tests/fuzz/ for 5 s (tools/run_fuzz.sh; `make fuzz` runs them long)
#   [7/7] lint: the C files as clang-format writes them, ruff clean (tools/lint.sh; `make format` fixes)
# Vulkan runs on Mesa's lavapipe (VK_DRIVER_FILES pins it, even where a GPU exists) with the
# validation layer on (RLX_VULKAN_VALIDATION=1): any validation message fails the test that
# caused it. Without a usable Vulkan device the Vulkan tests are skipped, saying why.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHON
lavapipe=(/usr/share/vulkan/icd.d/lvp_icd.*.json)
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -e "${lavapipe[0]}" ]; then export VK_DRIVER_FILES="${lavapipe[0]}"; fi
export RLX_VULKAN_VALIDATION=${RLX_VULKAN_VALIDATION:-1}

names=("pytest tests/" "C tests under valgrind" "ASan+UBSan pytest" "C tests under TSan" "Vulkan (lavapipe)"
       "fuzz, 5 s per target" "lint (clang-format, ruff)")
n=${#names[@]}
status=()
phase=0

start_phase() {
  phase=$((phase + 1))
  printf '\n==================== [%s/%s] %s ====================\n' "$phase" "$n" "${names[$((phase - 1))]}"
}

start_phase
"$PYTHON" -m pytest tests -q -p no:cacheprovider --ignore=tests/vulkan
rc=$?
if [ $rc -eq 5 ]; then echo "error: pytest collected no tests under tests/" >&2; fi
status+=($rc)

start_phase
tools/run_c_tests.sh
status+=($?)

start_phase
tools/run_asan_tests.sh
status+=($?)

start_phase
tools/run_c_tests.sh --tsan
status+=($?)

start_phase
"$PYTHON" -m pytest tests/vulkan -q -p no:cacheprovider
rc=$?
if [ $rc -eq 5 ]; then rc=0; fi   # no usable Vulkan device: the suite said why and collected nothing
status+=($rc)

start_phase
tools/run_fuzz.sh --time 5
status+=($?)

start_phase
tools/lint.sh
status+=($?)

echo
echo "==================== make test summary ===================="
fail=0
for i in "${!names[@]}"; do
  if [ "${status[$i]}" -eq 0 ]; then r=ok; else r="FAILED (exit ${status[$i]})"; fail=1; fi
  printf '  [%d/%d] %-26s %s\n' $((i + 1)) "$n" "${names[$i]}" "$r"
done
exit $fail
