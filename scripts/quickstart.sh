#!/usr/bin/env bash
# Quick start: set up everything, build alpaca-train, and run the main job.
# Until the trainer lands (issue 7) this stops at the built binary and says so; the trainer's
# change replaces the last step with a small fine-tune on the bundled default data.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${ALPACA_BUILD_DIR:-build}
JOBS=${ALPACA_JOBS:-$(nproc)}

bash scripts/install_deps.sh
echo "[quickstart] configuring and building $BUILD/alpaca-train (-j $JOBS)"
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j "$JOBS" --target alpaca-train

"$BUILD/alpaca-train" --help
echo
echo "[quickstart] built $BUILD/alpaca-train (flags above)."
echo "[quickstart] Training is not part of this build yet: the fine-tune on the bundled default data"
echo "[quickstart] arrives with the trainer, and this script will then run it end to end."
