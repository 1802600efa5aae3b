#!/usr/bin/env bash
# Builds the unit tests with AddressSanitizer + UndefinedBehaviorSanitizer (GCC's, the compiler
# of the normal build, so the same warnings and precompiled headers apply) into build-asan/ and
# runs them (ctest -L unit). LibTorch, MPI and
# sentencepiece are not instrumented: errors in our code and in the headers we compile are
# caught, not inside those libraries. Leak checking is off (LibTorch and Open MPI keep
# process-lifetime allocations that LeakSanitizer reports); the fuzz targets do check leaks.
#
#   scripts/sanitize.sh [extra ctest args, e.g. -R safetensors]
#
# Cost (docs/reliability.md): a second full build of the library and the unit tests, about 11 min
# on 2 cores (1.75x the normal CPU time per unit), then ~2 min of tests (33, all pass); too much for CI,
# which fuzzes the parsers under the same sanitizers instead and runs their unit tests built
# against the parser libraries alone (fuzz/CMakeLists.txt, ctest -L unit_asan in build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${ALPACA_ASAN_BUILD_DIR:-build-asan}
JOBS=${ALPACA_JOBS:-$(nproc)}
t0=$(date +%s)
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# GCC's flow-based warnings see the sanitizers' instrumentation and report bogus problems in
# libstdc++ (std::regex: maybe-uninitialized; string concatenation: array-bounds); the normal
# build keeps them errors, here they stay warnings.
NOERR="-Wno-error=maybe-uninitialized -Wno-error=array-bounds -Wno-error=stringop-overflow"
NOERR="$NOERR -Wno-error=stringop-overread -Wno-error=restrict -Wno-error=null-dereference"
# Without our CUDA code nothing names NCCL, but LibTorch's libtorch_cuda.so still needs the NCCL
# of the wheel beside it (its $ORIGIN rpath, which ld does not follow): point the linker there,
# or it takes an older system libnccl and fails on missing symbols.
LINK="$SAN"
for d in .venv/lib/python3*/site-packages/nvidia/nccl/lib; do
  [ -d "$d" ] && LINK="$LINK -Wl,-rpath-link,$(pwd)/$d"
done
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$SAN $NOERR" -DCMAKE_C_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="$LINK" \
  -DALPACA_WITH_CUDA=OFF ${CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache} >/dev/null
# Only what the unit label needs: the unit test executables (and alpaca-train, which some run).
# ctest's arguments (-R ...) pick the tests, and so what is built.
targets=$(ctest --test-dir "$BUILD" -N -L unit "$@" 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: \([A-Za-z0-9_]*\).*/\1/p' | sed 's/_np[0-9]*$//' | sort -u)
# Some unit tests are scripts or fixtures, not executables: keep the names ninja knows.
known=$(ninja -C "$BUILD" -t targets all | sed 's/:.*//' | sort -u)
targets=$(comm -12 <(echo "$targets") <(echo "$known") | tr '\n' ' ')
if [ -z "$targets" ]; then targets=all; fi
cmake --build "$BUILD" -j "$JOBS" --target alpaca-train $targets
t1=$(date +%s)
echo "[sanitize] build took $((t1 - t0)) s"
export ASAN_OPTIONS="detect_leaks=0:protect_shadow_gap=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
ctest --test-dir "$BUILD" --output-on-failure -L unit -j 1 "$@"
echo "[sanitize] tests took $(( $(date +%s) - t1 )) s"
