#!/usr/bin/env bash
# Fuzzes every parser of files other people make (fuzz/targets/*.cpp) with libFuzzer + ASan +
# UBSan for a given time each, then prints one line per target: executions, corpus size,
# coverage (libFuzzer's cov: edge count), crashes.
#
#   scripts/fuzz.sh [seconds per target, default 60] [target name regex]
#
# Builds fuzz/ with clang-14 into build-fuzz/ (a project of its own: no LibTorch library).
# A crash, UB, a leak, an input slower than 10 s (-timeout) or an allocation over 1 GB fails; the
# input that did it is left in build-fuzz/runs/<target>/ (crash-*, leak-*, timeout-*): add it to
# fuzz/corpus/<target>/ with the fix. New inputs go to build-fuzz/runs/<target>/corpus, never
# into the committed seed corpus (merge a few in by hand when they add coverage).
#
# Internal: scripts/fuzz.sh --run-one <binary> <seed dir> <work dir> <seconds> (what ctest runs).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

run_one() {
  local bin=$1 seeds=$2 work=$3 secs=$4 name
  name=$(basename "$bin")
  rm -rf "$work" && mkdir -p "$work/corpus" "$work/tmp"
  local log="$work/fuzz.log" rc=0 dict=()
  [ -f "$ROOT/fuzz/dict/$name.dict" ] && dict=(-dict="$ROOT/fuzz/dict/$name.dict")
  # detect_leaks: a leak fails. -timeout: one input slower than 10 s is a hang. Ours come after
  # the caller's options so that an inherited detect_leaks=0 cannot let a leak pass.
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:abort_on_error=0" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1" \
  TMPDIR="$work/tmp" \
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 \
      -print_final_stats=1 "${dict[@]}" -artifact_prefix="$work/" "$work/corpus" "$seeds" >"$log" 2>&1 || rc=$?
  local execs cov corp crashes
  # A run that crashed has no final stats: a grep that finds nothing must not end the script
  # (set -e, pipefail) before it says which target failed and why.
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | awk '{print $2}' | tail -1 || true)
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | awk '{print $2}' | tail -1 || true)
  crashes=$(find "$work" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  printf '%-28s execs %-9s corpus %-12s cov %-6s crashes %s (%ss)\n' "$name" "${execs:-?}" "${corp:-?}" "${cov:-?}" "$crashes" "$secs"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    echo "--- $name failed (rc $rc); last lines of $log:"
    tail -60 "$log"
    return 1
  fi
}

if [ "${1:-}" = "--run-one" ]; then
  shift
  run_one "$@"
  exit $?
fi

SECS=${1:-60}
FILTER=${2:-.}
BUILD="$ROOT/build-fuzz"
CXX_BIN=${ALPACA_FUZZ_CXX:-clang++-14}
if [ ! -f "$BUILD/build.ninja" ]; then
  CXX="$CXX_BIN" cmake -S "$ROOT/fuzz" -B "$BUILD" -G Ninja \
    ${CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache} >/dev/null
fi
# Quiet when it builds; the whole log when it does not (ninja prints its errors on stdout, and a
# silent exit here once ended CI with no word of why).
if ! ninja -C "$BUILD" -j"${ALPACA_FUZZ_JOBS:-2}" >"$BUILD/ninja.log" 2>&1; then
  echo "[fuzz] building $BUILD failed:"
  tail -60 "$BUILD/ninja.log"
  exit 1
fi
# The targets run side by side, one per core (each libFuzzer process is single-threaded): 13 targets
# at 10 s took 130 s one after another on CI's two cores, 70 s two at a time. Each target's report is
# printed whole, in name order, once all have run.
targets=()
for src in "$ROOT"/fuzz/targets/fuzz_*.cpp; do
  name=$(basename "$src" .cpp)
  [[ "$name" =~ $FILTER ]] || continue
  targets+=("$name")
  rm -f "$BUILD/runs/$name.report"
done
mkdir -p "$BUILD/runs"
fail=0
printf '%s\n' "${targets[@]}" |
  xargs -P "${ALPACA_FUZZ_RUN_JOBS:-$(nproc)}" -I{} bash -c \
    '"$1" --run-one "$2/{}" "$3/fuzz/corpus/{}" "$2/runs/{}" "$4" > "$2/runs/{}.report" 2>&1' \
    _ "$ROOT/scripts/fuzz.sh" "$BUILD" "$ROOT" "$SECS" || fail=1
for name in "${targets[@]}"; do
  cat "$BUILD/runs/$name.report" 2>/dev/null || { echo "--- $name: no report"; fail=1; }
done
exit $fail
