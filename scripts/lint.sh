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
#   scripts/lint.sh tidy PATH...    clang-tidy on the units at or under some paths only
#   scripts/lint.sh tidy --changed  clang-tidy on the units whose inputs (source, our headers,
#                                   compile command, .clang-tidy, clang-tidy's version) changed
#                                   since they last passed: .ci/tidy-clean (scripts/tidy_cache.py)
#   scripts/lint.sh tidy --record [--changed|PATH...]  the same, and when clang-tidy passes, add
#                                   the units it checked to .ci/tidy-clean (commit that file)
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
tidy_clean=$root/.ci/tidy-clean

sources() {  # tracked and new (not ignored) C/C++ files, NUL-separated
  git ls-files -z --cached --others --exclude-standard -- \
    'src/*.c' 'src/*.cc' 'src/*.h' 'tests/*.c' 'tests/*.cc' 'tests/*.h' 'bench/*.c' 'bench/*.cc' 'bench/*.h' |
    xargs -0 -r -I{} sh -c '[ -f "$1" ] && printf "%s\0" "$1"' _ {}
}

# Translation units checked without bugprone-unchecked-optional-access: clang-tidy 15's dataflow
# analysis behind it has no iteration bound (LLVM 16 added one) and runs for more than 10 minutes of
# CPU on these files (microvm files.cc, process.cc, vm_backend.cc: > 9, > 2 and > 6 min of that check
# alone before they were stopped; the guest agent's agent.cc and processes.cc, vm_sandbox.cc,
# microvm template.cc and sandbox.cc > 5 to > 12 min of clang-tidy in all; microvm_backend.cc and the vm
# input_test.cc > 26 min each on a loaded machine; microvm changes.cc and protocol_test.cc > 38 min each, loaded; microvm channel.cc > 8 min; the guest agent's files.cc > 14 min, loaded; vm_template.cc > 23 min once it
# included vm_sandbox.h's desktop; microvm network.cc > 20 min once sandbox.h held
# the create's optional policy and lease), against
# ~10 s for every other check together. Split the long function there
# rather than growing this list.
unbounded_dataflow_tus=(src/runtime/fncall/call.cc src/runtime/microvm/files.cc src/runtime/microvm/process.cc
  src/runtime/vm/vm_backend.cc src/runtime/vm/vm_sandbox.cc src/runtime/microvm/template.cc src/runtime/microvm/sandbox.cc
  src/guest/agent/agent.cc src/guest/agent/processes.cc src/runtime/microvm/microvm_backend.cc tests/unit/vm/input_test.cc
  src/runtime/microvm/changes.cc tests/unit/microvm/protocol_test.cc src/runtime/microvm/channel.cc
  src/guest/agent/files.cc src/runtime/vm/vm_template.cc src/runtime/microvm/network.cc)

# Our translation units in the compile database (src/ and tests/, not build/gen's generated code),
# relative to the root, one a line; with arguments, those under (or equal to) one of them.
tidy_units() {
  if [[ ${1:-} == --changed ]]; then
    python3 "$root/scripts/tidy_cache.py" units "$build" "$tidy_clean"
    return
  fi
  python3 - "$root" "$build/compile_commands.json" "$@" <<'PY'
import json, os, sys
root, db, picks = sys.argv[1], sys.argv[2], [p.rstrip("/") for p in sys.argv[3:]]
units = {os.path.relpath(os.path.join(e["directory"], e["file"]), root) for e in json.load(open(db))}
for u in sorted(units):
    if u.startswith(("src/", "tests/")) and (not picks or any(u == p or u.startswith(p + "/") for p in picks)):
        print(u)
PY
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
  local jobs=${WARREN_LINT_JOBS:-$(nproc)}
  local units=() full=() bounded=() u
  local record=0
  if [[ ${1:-} == --record ]]; then
    record=1
    shift
  fi
  local listed
  listed=$(tidy_units "$@") || return 1
  mapfile -t units < <(grep . <<<"$listed")
  if ((${#units[@]} == 0)) && [[ ${1:-} == --changed ]]; then
    echo "lint: clang-tidy: every unit passed before at its present inputs ($tidy_clean)"
    return 0
  fi
  if ((${#units[@]} == 0)); then
    echo "lint: no translation unit of $build/compile_commands.json matches: $*" >&2
    return 1
  fi
  # run-clang-tidy takes regexes over the database's absolute paths: each unit, anchored and escaped.
  for u in "${units[@]}"; do
    local re="^$(sed 's/[].[*^$()+?{}|\]/\\&/g' <<<"$root/$u")\$"
    if [[ " ${unbounded_dataflow_tus[*]} " == *" $u "* ]]; then bounded+=("$re"); else full+=("$re"); fi
  done
  echo "lint: clang-tidy ($("$clang_tidy" --version | grep -o 'version [0-9.]*'), $jobs jobs, ${#units[@]} units)"
  # Headers are checked where a translation unit of ours includes them (HeaderFilterRegex).
  # GCC-only warning flags in the database are not clang-tidy's concern; -Wno-error lets .clang-tidy
  # choose among clang's own warnings (clang-diagnostic-*), which WarningsAsErrors then fails on.
  local deadline=$((SECONDS + ${WARREN_LINT_TIMEOUT:-1800})) rc=0
  run_tidy() {
    timeout $((deadline - SECONDS > 0 ? deadline - SECONDS : 1)) run-clang-tidy-15 -clang-tidy-binary "$clang_tidy" \
      -p "$build" -j "$jobs" -quiet -header-filter="^$root/(src|tests)/" -extra-arg=-Wno-unknown-warning-option \
      -extra-arg=-Wno-error "$@" >>"$build/clang-tidy.log" 2>&1
  }
  : >"$build/clang-tidy.log"
  if ((${#full[@]})); then run_tidy "${full[@]}" || rc=$?; fi
  if ((${#bounded[@]})) && ((rc != 124)); then
    run_tidy -checks=-bugprone-unchecked-optional-access "${bounded[@]}" || rc=$?
  fi
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
  if ((record)); then python3 "$root/scripts/tidy_cache.py" record "$build" "$tidy_clean" "${units[@]}" || return 1; fi
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
  *) echo "usage: $0 [format|py|tidy [--record] [--changed|PATH...]]" >&2; exit 2 ;;
esac
