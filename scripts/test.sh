#!/usr/bin/env bash
# Configures, builds (both cores) and runs the whole CPU test suite. Extra arguments go to ctest,
# e.g. `scripts/test.sh -L unit` or `scripts/test.sh -R fsdp`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${ALPACA_BUILD_DIR:-build}
JOBS=${ALPACA_JOBS:-$(nproc)}
t0=$(date +%s)
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j "$JOBS"
t1=$(date +%s)
echo "[test] build took $((t1 - t0)) s"
# GPU tests need a GPU; everything else runs here. Multi-rank tests use mpirun with Open MPI's
# root/oversubscribe settings from tests/CMakeLists.txt. Two tests at a time (ALPACA_TEST_JOBS):
# the suite waits on processes, collectives and Python more than on the cores, and every test
# passed under a load average of 7 (2026-12-03); the *_npN tests with N > 1 reserve both cores.
# ctest starts the longest tests first when it knows their times; a fresh build does not, and then
# a 90 s test can start last. Seed its cost data from tests/ctest_costs.txt (a copy of a full run's).
costs="$BUILD/Testing/Temporary/CTestCostData.txt"
if [ ! -f "$costs" ]; then
  mkdir -p "$(dirname "$costs")" && grep -v '^#' tests/ctest_costs.txt > "$costs"
fi
ctest --test-dir "$BUILD" --output-on-failure -LE gpu -j "${ALPACA_TEST_JOBS:-2}" "$@"
echo "[test] tests took $(( $(date +%s) - t1 )) s"
