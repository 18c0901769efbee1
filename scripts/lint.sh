#!/bin/bash
# Lints the C/C++ tree: clang-format (no file would change; scripts/format.sh
# fixes that) and clang-tidy (.clang-tidy: bugprone-*, performance-*) over the
# translation units of src/ and tests/ in build/compile_commands.json (written
# by the release build; generated protobuf code is left out). Exits non-zero on
# any finding. Needs the release build (scripts/setup.sh) for the compile
# database and the generated headers.
#
#   scripts/lint.sh                 both steps
#   scripts/lint.sh format|py|tidy  one step (py: ruff + mypy on the SDK)
#   scripts/lint.sh tidy FILE...    clang-tidy on some files only
#
# Environment: WARREN_LINT_JOBS (clang-tidy processes, default: nproc),
# WARREN_LINT_TIMEOUT (seconds for the clang-tidy step, default 1800),
# WARREN_BUILD_DIR (default build).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
clang_format=${CLANG_FORMAT:-clang-format-15}
clang_tidy=${CLANG_TIDY:-clang-tidy-15}
build=${WARREN_BUILD_DIR:-build}

sources() {  # tracked and new (not ignored) C/C++ files, NUL-separated
  git ls-files -z --cached --others --exclude-standard -- \
    'src/*.c' 'src/*.cc' 'src/*.h' 'tests/*.c' 'tests/*.cc' 'tests/*.h' 'bench/*.c' 'bench/*.cc' 'bench/*.h' |
    xargs -0 -r -I{} sh -c '[ -f "$1" ] && printf "%s\0" "$1"' _ {}
}

need() {
  command -v "$1" >/dev/null || { echo "lint: $1 not found (scripts/setup.sh installs it)" >&2; exit 1; }
}

lint_format() {
  need "$clang_format"
  echo "lint: clang-format ($("$clang_format" --version | grep -o 'version [0-9.]*'))"
  local bad
  bad=$(sources | xargs -0 -r -n 20 "$clang_format" --dry-run 2>&1 | grep -oE '^[^:]+:[0-9]+:[0-9]+: (warning|error)' |
    cut -d: -f1 | sort -u)
  if [[ -n $bad ]]; then
    echo "lint: clang-format would change $(wc -l <<<"$bad") file(s) (run scripts/format.sh):"
    sed 's/^/  /' <<<"$bad"
    return 1
  fi
  echo "lint: clang-format: ok"
}

lint_tidy() {
  need "$clang_tidy"
  need run-clang-tidy-15
  if [[ ! -f $build/compile_commands.json ]]; then
    echo "lint: $build/compile_commands.json missing (cmake --preset release && cmake --build build)" >&2
    return 1
  fi
  local files=("$@")
  local jobs=${WARREN_LINT_JOBS:-$(nproc)}
  echo "lint: clang-tidy ($("$clang_tidy" --version | grep -o 'version [0-9.]*'), $jobs jobs)"
  # run-clang-tidy takes regexes over the database's paths: ours, not build/gen.
  local filter=("$root/(src|tests)/")
  ((${#files[@]})) && filter=("${files[@]/#/$root/}")
  # Headers are checked where a translation unit of ours includes them (HeaderFilterRegex).
  # GCC-only warning flags in the database are not clang-tidy's concern; -Wno-error lets .clang-tidy
  # choose among clang's own warnings (clang-diagnostic-*), which WarningsAsErrors then fails on.
  timeout "${WARREN_LINT_TIMEOUT:-1800}" run-clang-tidy-15 -clang-tidy-binary "$clang_tidy" -p "$build" -j "$jobs" \
    -quiet -header-filter="^$root/(src|tests)/" -extra-arg=-Wno-unknown-warning-option -extra-arg=-Wno-error \
    "${filter[@]}" >"$build/clang-tidy.log" 2>&1
  local rc=$?
  # One line per finding (a header's findings repeat in every unit that includes it).
  local findings
  findings=$(grep -E '^/[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$build/clang-tidy.log" | sed "s|^$root/||" | sort -u)
  [[ -n $findings ]] && echo "$findings"
  if ((rc == 124)); then
    echo "lint: clang-tidy timed out after ${WARREN_LINT_TIMEOUT:-1800} s"
    return 1
  fi
  if ((rc)) || [[ -n $findings ]]; then
    echo "lint: clang-tidy: $(grep -c . <<<"$findings") finding(s) above (full log: $build/clang-tidy.log)"
    return 1
  fi
  echo "lint: clang-tidy: ok"
}

# The Python SDK: ruff and mypy (strict on warren/, generated _proto left
# out), configured in sdk/python/pyproject.toml; both from .venv (setup.sh).
lint_py() {
  local py=${WARREN_PYTHON:-$root/.venv/bin/python} rc=0
  echo "lint: ruff and mypy on the SDK"
  "$py" -m ruff check sdk/python || rc=1
  "$py" -m mypy --config-file sdk/python/pyproject.toml sdk/python/warren || rc=1
  return $rc
}

case ${1:-all} in
  --list-sources) sources ;;
  format) lint_format ;;
  tidy) shift; lint_tidy "$@" ;;
  py) lint_py ;;
  all)
    rc=0
    lint_format || rc=1
    lint_py || rc=1
    lint_tidy || rc=1
    exit $rc
    ;;
  *) echo "usage: $0 [format|py|tidy [FILE...]]" >&2; exit 2 ;;
esac
