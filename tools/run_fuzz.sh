#!/usr/bin/env bash
# Runs the coverage-guided fuzz targets of tests/fuzz/ (atheris + libFuzzer), one after another.
#   tools/run_fuzz.sh --time S [target...]   each target for S seconds   (make test: 5 s each)
#   tools/run_fuzz.sh --runs N [target...]   each target for N inputs    (make fuzz: 1,000,000 each)
# Targets: config_file weights_file tokenizer_dir gguf_file (default: all). Each starts from its committed
# seeds (tests/fuzz/corpus/<target>/, read only) and the crash files of earlier findings
# (tests/fuzz/crashes/<target>-*), mutates with its dictionary (tests/fuzz/<target>.dict: the
# format's keys), and keeps what it learns in a temporary corpus that is thrown away.
# A crash, hang (-timeout) or memory blow-up (-rss_limit_mb) is written to
# tests/fuzz/crashes/<target>-<kind>-<sha1>: replay it with pytest tests/fuzz, fix, keep the file.
# Prints one line per target (inputs run, seconds, crashes); exit status non-zero on any finding.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
case "$1" in
  --time) limit=(-max_total_time="$2") ;;
  --runs) limit=(-runs="$2") ;;
  *) usage ;;
esac
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config_file weights_file tokenizer_dir gguf_file)

if ! "$PYTHON" -c 'import atheris' 2>/dev/null; then
  echo "error: atheris is not installed in $PYTHON (pip install -e '.[test]')" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rlx-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p tests/fuzz/crashes
export RLX_FUZZ_SCRATCH="$work/scratch" OPENBLAS_NUM_THREADS=1

fail=0
summary=()
for t in "${targets[@]}"; do
  if [ ! -f "tests/fuzz/$t.py" ]; then echo "error: no fuzz target tests/fuzz/$t.py" >&2; exit 2; fi
  mkdir -p "$work/corpus-$t" "$work/seeds-$t"
  cp tests/fuzz/corpus/"$t"/* "$work/seeds-$t"/ 2>/dev/null
  cp tests/fuzz/crashes/"$t"-* "$work/seeds-$t"/ 2>/dev/null
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  max_len=8192
  [ "$t" = gguf_file ] && max_len=65536   # a GGUF file with a vocabulary and tensors
  log="$work/$t.log"
  start=$(date +%s%N)
  "$PYTHON" "tests/fuzz/$t.py" "${limit[@]}" "${dict[@]}" -max_len=$max_len -timeout=10 -rss_limit_mb=3072 \
    -print_final_stats=1 -artifact_prefix="tests/fuzz/crashes/$t-" \
    "$work/corpus-$t" "$work/seeds-$t" >"$log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  crashes=$(grep -c "Test unit written to" "$log")
  line=$(printf '%-14s %10s inputs in %4d.%d s   crashes: %s   exit %s' "$t" "${runs:-?}" $((ms / 1000)) \
         $((ms % 1000 / 100)) "$crashes" "$rc")
  echo "$line"
  summary+=("$line")
  if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
    fail=1
    echo "---- $t: last lines of the libFuzzer log ----"
    tail -40 "$log"
  fi
done
echo
echo "fuzz summary (${limit[*]}):"
printf '  %s\n' "${summary[@]}"
exit $fail
