#!/bin/bash
# Runs every test: gtest unit tests (ctest on build/), the SDK unit tests, the
# integration tests (pytest through the SDK against a real warrend started by
# the tests; their SDK-level files a second time against a 4-node cluster), the escape suite (tests/security), the fault soak's CI form (tests/soak) and, with WARREN_ASAN=1,
# the unit tests again under ASan/UBSan (build-asan/), with WARREN_TSAN=1 the node and runtime unit tests under
# ThreadSanitizer (build-tsan/, scripts/tsan.supp), and the linters (scripts/lint.sh: clang-format, ruff + mypy;
# clang-tidy with WARREN_TIDY=1).
# Exits non-zero if anything failed. Expects scripts/setup.sh to have run. Extra pytest arguments:
# WARREN_PYTEST_ARGS (e.g. "-m 'not slow'").
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
failed=()

# Each step's output also goes to $logs/<step>.log; a failed step's summary
# is printed again at the very end, where a reader of the run's tail sees it.
logs=${WARREN_TEST_LOGS:-$root/build/test-logs}
mkdir -p "$logs"
step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  if "$@" 2>&1 | tee "$logs/$name.log"; then  # pipefail: the command's status
    echo "=== $name: ok ($((SECONDS - t0)) s)"
  else
    echo "=== $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
}

step lint-format scripts/lint.sh format
step lint-py scripts/lint.sh py
# clang-tidy (.clang-tidy) over the release build's compile database and its
# generated protobuf headers, so after setup.sh's build. The whole tree takes
# more than 30 min on 2 cores, so CI (WARREN_TIDY=1, set by .ci/run) checks the
# units whose inputs changed since they last passed (.ci/tidy-clean, keyed on
# the unit's source, our headers it includes, its compile command, .clang-tidy
# and clang-tidy's version: scripts/tidy_cache.py); WARREN_TIDY=all checks the
# whole tree. Record a clean check with `scripts/lint.sh tidy --record --changed`
# and commit .ci/tidy-clean. A finding fails the run.
if [[ ${WARREN_TIDY:-0} == all ]]; then
  step lint-tidy scripts/lint.sh tidy
elif [[ ${WARREN_TIDY:-0} == 1 ]]; then
  step lint-tidy scripts/lint.sh tidy --changed
fi
# The sanitizer builds (below) start now, in the background at the lowest CPU
# and I/O priority: they take the CPU the integration tests leave idle (their
# guests boot, daemons wait, servers sleep) instead of ~20 min of their own at
# the end. Their steps wait for them and print their logs.
tsan_targets=(node_test node_lifecycle_test node_ring_buffer_test node_process_table_test node_run_dir_test
  uid_slots_test fncall_test)
san_build() {
  if [[ ${WARREN_ASAN:-0} == 1 ]]; then
    (cmake --preset asan && cmake --build build-asan -j2) >"$logs/asan-build-bg.log" 2>&1
    echo $? >"$logs/asan-build.rc"
  fi
  if [[ ${WARREN_TSAN:-0} == 1 ]]; then
    (cmake --preset tsan >/dev/null && cmake --build build-tsan -j2 --target "${tsan_targets[@]}") \
      >"$logs/tsan-build-bg.log" 2>&1
    echo $? >"$logs/tsan-build.rc"
  fi
}
rm -f "$logs/asan-build.rc" "$logs/tsan-build.rc"
san_pid=
if [[ ${WARREN_ASAN:-0} == 1 || ${WARREN_TSAN:-0} == 1 ]]; then
  {
    renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true  # before it starts anything: inherited
    ionice -c 3 -p "$BASHPID" >/dev/null 2>&1 || true
    san_build
  } </dev/null &
  san_pid=$!
fi
# Waits for the background sanitizer build of $1 (asan|tsan), prints its log's
# tail and exits with its status.
san_wait() {
  while [[ ! -e $logs/$1-build.rc ]] && kill -0 "$san_pid" 2>/dev/null; do sleep 5; done
  tail -n 20 "$logs/$1-build-bg.log"
  [[ -e $logs/$1-build.rc ]] && return "$(cat "$logs/$1-build.rc")"
  echo "the $1 build ended without a status"
  return 1
}

step unit ctest --test-dir build --output-on-failure -j2 --timeout 600
step sdk .venv/bin/python -m pytest -q sdk/python/tests
# shellcheck disable=SC2086
eval "extra=(${WARREN_PYTEST_ARGS:-})"
# Bounded for CI's 90 minutes: the leak test (A13) at 2000 cycles (~110 s; its case's 5000, ~270 s,
# run by hand: WARREN_A13_CYCLES=5000 .venv/bin/python -m pytest tests/integration/test_lifecycle.py -k a13).
step integration env WARREN_A13_CYCLES=2000 .venv/bin/python -m pytest -v -rA --durations=15 tests/integration \
  "${extra[@]}"
# The same SDK-level integration files again, as a second configuration (issue 15): the session's daemon
# is a real etcd and 4 warrend nodes, each in its own network namespace (a veth on a bridge of the tests,
# 198.18.x.0/24) with its own state dir and cgroup subtree, and the client talks to node 1, which places
# creates and forwards every other call (tests/integration/cluster_env.py; the files: CLUSTER_SUITE in
# tests/integration/conftest.py, single-node-only tests skipped there saying why). Bounded for CI: the
# leak test (A13) at 500 cycles (every node checked; 2000 in the step above) and without the
# 1 GiB transfer (test_a10_one_gigabyte, in the step above): ~4 min on 2 cores (161 tests, 3 skipped).
step integration-cluster env WARREN_TEST_CLUSTER=4 WARREN_A13_CYCLES=500 .venv/bin/python -m pytest -v -rA \
  --durations=10 tests/integration -k "not test_a10_one_gigabyte" "${extra[@]}"
step conformance .venv/bin/python -m pytest -v -rA tests/conformance "${extra[@]}"
step security .venv/bin/python -m pytest -v -rA tests/security "${extra[@]}"
# The fault soak's bounded CI form (WARREN_SOAK_CYCLES/KILLS; long form: bench/soak).
step soak .venv/bin/python -m pytest -v -rA -s tests/soak "${extra[@]}"

if [[ ${WARREN_ASAN:-0} == 1 ]]; then
  step asan-build san_wait asan
  step asan-unit ctest --test-dir build-asan --output-on-failure -j2 --timeout 900
fi

if [[ ${WARREN_TSAN:-0} == 1 ]]; then
  # The node and runtime unit tests (the daemon's threads live there), built alone since TSan builds
  # are slow. Not rooted_files_test (no threads; its 100 MB streaming cases run 10x slower) and not
  # container_backend_test: its sandboxes' init children run instrumented code after a raw clone3
  # that TSan never sees (no fork interceptor), so TSan reports stale-shadow races in them (pid 1)
  # and they can hang on TSan's internal locks.
  step tsan-build san_wait tsan
  # ctest selects those executables' tests by their gtest suite names.
  tsan_suites=$(for t in "${tsan_targets[@]}"; do
    f=$(find build-tsan/tests -type f -name "$t" -perm -u+x | head -1)
    [[ -n $f ]] && "$f" --gtest_list_tests | grep -E '^[A-Za-z0-9_/]+\.$' | sed 's/\.$//'
  done | sort -u | paste -sd'|')
  # halt_on_error=0: every report of a run is printed; the test still fails (exit code 66).
  step tsan-unit env TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp halt_on_error=0 second_deadlock_stack=1" \
    ctest --test-dir build-tsan --output-on-failure -j2 --timeout 900 -R "^(${tsan_suites:-none})\\."
fi

if ((${#failed[@]})); then
  for name in "${failed[@]}"; do
    echo "=== summary of the failed step $name ($logs/$name.log):"
    # pytest's failure lines and assertion messages, else the log's tail.
    grep -E '^(FAILED|ERROR) |^E  ' "$logs/$name.log" | cut -c1-2000 | tail -n 80 ||
      tail -n 60 "$logs/$name.log"
  done
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all tests passed"
