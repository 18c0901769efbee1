#!/bin/bash
# Runs every test: gtest unit tests (ctest on build/), the SDK unit tests, the
# integration tests (pytest through the SDK against a real warrend started by
# the tests), the escape suite (tests/security), the fault soak's CI form (tests/soak) and, with WARREN_ASAN=1,
# the unit tests again under ASan/UBSan (build-asan/). Exits non-zero if anything failed. Expects scripts/setup.sh
# to have run. Extra pytest arguments: WARREN_PYTEST_ARGS (e.g. "-m 'not slow'").
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
failed=()

step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  if "$@"; then
    echo "=== $name: ok ($((SECONDS - t0)) s)"
  else
    echo "=== $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
}

step unit ctest --test-dir build --output-on-failure -j2 --timeout 600
step sdk .venv/bin/python -m pytest -q sdk/python/tests
# shellcheck disable=SC2086
eval "extra=(${WARREN_PYTEST_ARGS:-})"
step integration .venv/bin/python -m pytest -v -rA --durations=15 tests/integration "${extra[@]}"
step conformance .venv/bin/python -m pytest -v -rA tests/conformance "${extra[@]}"
step security .venv/bin/python -m pytest -v -rA tests/security "${extra[@]}"
# The fault soak's bounded CI form (WARREN_SOAK_CYCLES/KILLS; long form: bench/soak).
step soak .venv/bin/python -m pytest -v -rA -s tests/soak "${extra[@]}"

if [[ ${WARREN_ASAN:-0} == 1 ]]; then
  step asan-build bash -c 'cmake --preset asan && cmake --build build-asan -j2'
  step asan-unit ctest --test-dir build-asan --output-on-failure -j2 --timeout 900
fi

if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all tests passed"
