#!/usr/bin/env bash
# The project's one C style (.clang-format) and one Python lint (ruff, [tool.ruff] in pyproject.toml).
#   tools/lint.sh          check: every C file of csrc/, tests/c/ and tests/fuzz/ as clang-format would
#                          write it, and `ruff check` clean (make test's last phase)
#   tools/lint.sh --fix    rewrite them: clang-format -i, ruff check --fix (make format)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
fix=0
[ "${1:-}" = --fix ] && fix=1
# clang-format 14 is Debian 12's; other versions break some lines differently.
CLANG_FORMAT=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [ -z "$CLANG_FORMAT" ]; then
  echo "lint: no clang-format (Debian: apt-get install clang-format-14)" >&2
  exit 1
fi
mapfile -t cfiles < <(git ls-files 'csrc/*.c' 'csrc/*.h' 'tests/c/*.c' 'tests/c/*.h' 'tests/fuzz/*.c')
rc=0
if [ $fix = 1 ]; then
  "$CLANG_FORMAT" -i "${cfiles[@]}" || rc=1
  "$PYTHON" -m ruff check --fix -q . || rc=1
else
  "$CLANG_FORMAT" --dry-run --Werror "${cfiles[@]}" 2>&1 | grep -E '^[^ ].*: (error|warning):' | cut -d: -f1 | sort -u \
    | sed 's/^/lint: not formatted (make format): /' >&2
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  "$PYTHON" -m ruff check -q . || rc=1
fi
[ $rc = 0 ] && echo "lint: ${#cfiles[@]} C files formatted, ruff clean"
exit $rc
