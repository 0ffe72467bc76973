#!/usr/bin/env bash
# The five phases of `make test`, in order. Every phase runs even when an
# earlier one failed, so one CI run shows every failure; the exit status is
# non-zero when any phase failed.
#   [1/5] pytest tests/                       (normal build, rlx/_C*.so in place)
#   [2/5] tests/c/test_*.c under valgrind     (tools/run_c_tests.sh)
#   [3/5] pytest tests/unit tests/bindings against an ASan+UBSan build
#                                             (tools/run_asan_tests.sh)
#   [4/5] tests/c/test_*.c under ThreadSanitizer (tools/run_c_tests.sh --tsan)
#   [5/5] each fuzz target of tests/fuzz/ for 5 s (tools/run_fuzz.sh; `make fuzz` runs them long)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHON

names=("pytest tests/" "C tests under valgrind" "ASan+UBSan pytest" "C tests under TSan" "fuzz, 5 s per target")
status=()

header() { printf '\n==================== [%s/5] %s ====================\n' "$1" "$2"; }

header 1 "${names[0]}"
"$PYTHON" -m pytest tests -q -p no:cacheprovider
rc=$?
if [ $rc -eq 5 ]; then echo "error: pytest collected no tests under tests/" >&2; fi
status+=($rc)

header 2 "${names[1]}"
tools/run_c_tests.sh
status+=($?)

header 3 "${names[2]}"
tools/run_asan_tests.sh
status+=($?)

header 4 "${names[3]}"
tools/run_c_tests.sh --tsan
status+=($?)

header 5 "${names[4]}"
tools/run_fuzz.sh --time 5
status+=($?)

echo
echo "==================== make test summary ===================="
fail=0
for i in 0 1 2 3 4; do
  if [ "${status[$i]}" -eq 0 ]; then r=ok; else r="FAILED (exit ${status[$i]})"; fail=1; fi
  printf '  [%d/5] %-26s %s\n' $((i + 1)) "${names[$i]}" "$r"
done
exit $fail
