#!/usr/bin/env bash
# Builds every tests/c/test_*.c (a standalone program with its own main())
# against the core C sources (not csrc/python/**) and runs each under valgrind.
# Prints one line per test and a final line `N passed, M failed`; exits
# non-zero when any test or the build failed. Logs: build/ctests/logs/.
#
#   tools/run_c_tests.sh [NAME ...]         run only tests/c/test_NAME.c (or test_NAME)
#   tools/run_c_tests.sh --tsan [NAME ...]  a ThreadSanitizer build (build/tsan) run directly, not
#                                           under valgrind: the pool, sequences stepped from
#                                           several threads (test_model), the TCP mesh (test_tcp)
#   RLX_NO_VALGRIND=1                       run the programs directly (quick local loop)
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=build/ctests
MAKE_VARS=()
if [ "${1:-}" = --tsan ]; then
  shift
  OUT=build/tsan
  # The baseline kernels only: ifunc resolvers run before TSan's runtime starts (cpu.h).
  MAKE_VARS=(OUT=$OUT "SANITIZE=-fsanitize=thread -DRLX_NO_CLONES")
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tools/tsan.supp"
  RLX_NO_VALGRIND=1
fi
mkdir -p "$OUT/logs"

# -k: one test that fails to compile must not hide the others (it is reported
# as FAIL below, "not built").
build_ok=1
if ! make -s -k -f tools/ctests.mk -j"$(nproc)" "${MAKE_VARS[@]}" all; then
  echo "C tests: build failed (see the compiler output above)" >&2
  build_ok=0
fi

tests=()
if [ $# -gt 0 ]; then
  for n in "$@"; do n=${n#test_}; n=${n%.c}; tests+=("tests/c/test_$n.c"); done
else
  shopt -s nullglob
  tests=(tests/c/test_*.c)
fi

# --keep-debuginfo: frames of libraries unloaded before exit (the Vulkan validation layer) stay
# named, so tools/valgrind-vulkan.supp can match the layer's own leaks.
VALGRIND=(valgrind --error-exitcode=1 --leak-check=full
          --errors-for-leak-kinds=definite,indirect --track-origins=yes -q
          --keep-debuginfo=yes --suppressions=tools/valgrind-vulkan.supp)
if [ "${RLX_NO_VALGRIND:-0}" != 0 ]; then VALGRIND=(); fi

passed=0; failed=0
for src in "${tests[@]}"; do
  name=$(basename "$src" .c)
  bin="$OUT/bin/$name"; log="$OUT/logs/$name.log"
  start=$EPOCHREALTIME
  if [ ! -x "$bin" ] || { [ $build_ok = 0 ] && ! make -s -q -f tools/ctests.mk "${MAKE_VARS[@]}" "$bin" 2>/dev/null; }; then
    echo "FAIL $name (not built)"; failed=$((failed + 1)); continue
  fi
  "${VALGRIND[@]}" "$bin" > "$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc -eq 0 ]; then
    echo "PASS $name (${secs}s)"; passed=$((passed + 1))
  else
    echo "FAIL $name (exit $rc, ${secs}s) — last lines of $log:"
    tail -n 40 "$log" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
done

if [ $build_ok = 0 ] && [ $failed -eq 0 ]; then failed=1; fi   # e.g. the core library itself
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
