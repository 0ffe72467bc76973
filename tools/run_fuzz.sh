#!/usr/bin/env bash
# Runs the coverage-guided fuzz targets of tests/fuzz/ (libFuzzer), one after another.
#   tools/run_fuzz.sh --time S [target...]   each target for S seconds   (make test: 5 s each)
#   tools/run_fuzz.sh --runs N [target...]   each target for N inputs    (make fuzz: 1,000,000 each)
# Targets: config_file weights_file tokenizer_dir gguf_file (Python, atheris) and tcp_wire (C: built by
# tools/fuzz.mk with a clang whose libFuzzer links: $FUZZ_CC, else clang, else the newest clang-N;
# without one it is skipped with one line; Debian: clang-15) (default: all). Each starts from its committed
# seeds (tests/fuzz/corpus/<target>/, read only) and the crash files of earlier findings
# (tests/fuzz/crashes/<target>-*), mutates with its dictionary (tests/fuzz/<target>.dict: the
# format's keys), and keeps what it learns in a temporary corpus that is thrown away.
# A crash, hang (-timeout) or memory blow-up (-rss_limit_mb; tcp_wire: also -malloc_limit_mb) is written to
# tests/fuzz/crashes/<target>-<kind>-<sha1>: replay it with pytest tests/fuzz, fix, keep the file.
# Prints one line per target (inputs run, seconds, crashes); exit status non-zero on any finding.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
case "$1" in
  --time) limit=(-max_total_time="$2") ;;
  --runs) limit=(-runs="$2") ;;
  *) usage ;;
esac
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config_file weights_file tokenizer_dir gguf_file tcp_wire)

for t in "${targets[@]}"; do
  if [ -f "tests/fuzz/$t.py" ] && ! "$PYTHON" -c 'import atheris' 2>/dev/null; then
    echo "error: atheris is not installed in $PYTHON (pip install -e '.[test]')" >&2
    exit 1
  fi
done

# A clang whose -fsanitize=fuzzer links (the compiler and libFuzzer's runtime), for the C targets.
find_fuzz_cc() {
  local c
  for c in ${FUZZ_CC:-} clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
    command -v "$c" >/dev/null 2>&1 || continue
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' |
      "$c" -fsanitize=fuzzer -x c - -o "$work/cc-check" 2>/dev/null && { echo "$c"; return; }
  done
}

work=$(mktemp -d "${TMPDIR:-/tmp}/rlx-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p tests/fuzz/crashes
export RLX_FUZZ_SCRATCH="$work/scratch" OPENBLAS_NUM_THREADS=1

fail=0
summary=()
for t in "${targets[@]}"; do
  if [ -f "tests/fuzz/$t.py" ]; then
    cmd=("$PYTHON" "tests/fuzz/$t.py")
  elif [ -f "tests/fuzz/$t.c" ]; then
    cc=${cc-$(find_fuzz_cc)}
    if [ -z "$cc" ]; then
      line=$(printf '%-14s skipped: no clang with libFuzzer (-fsanitize=fuzzer); Debian: apt-get install clang-15' "$t")
      echo "$line"
      summary+=("$line")
      continue
    fi
    if ! make -s -f tools/fuzz.mk FUZZ_CC="$cc" "build/fuzz/bin/$t" >"$work/$t.build.log" 2>&1; then
      echo "$t: build failed ($cc):"
      cat "$work/$t.build.log"
      fail=1
      summary+=("$t: build failed")
      continue
    fi
    cmd=("build/fuzz/bin/$t")
  else
    echo "error: no fuzz target tests/fuzz/$t.py or tests/fuzz/$t.c" >&2; exit 2
  fi
  mkdir -p "$work/corpus-$t" "$work/seeds-$t"
  cp tests/fuzz/corpus/"$t"/* "$work/seeds-$t"/ 2>/dev/null
  cp tests/fuzz/crashes/"$t"-* "$work/seeds-$t"/ 2>/dev/null
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  max_len=8192 mem=(-rss_limit_mb=3072)
  [ "$t" = gguf_file ] && max_len=65536   # a GGUF file with a vocabulary and tensors
  # tcp_wire: one connection's bytes; no allocation may exceed 64 MiB (nothing the peer sends sizes one)
  [ "$t" = tcp_wire ] && max_len=4096 mem=(-rss_limit_mb=2048 -malloc_limit_mb=64)
  log="$work/$t.log"
  start=$(date +%s%N)
  "${cmd[@]}" "${limit[@]}" "${dict[@]}" -max_len=$max_len -timeout=10 "${mem[@]}" \
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
