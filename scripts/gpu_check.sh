#!/usr/bin/env bash
# The whole GPU verification in one call (issue 9), <= 8 minutes on a one-GPU machine that has
# PyTorch (LibTorch + NCCL inside the wheel), CMake, ninja and a C++ compiler but no Debian
# packages and no network:
#   1. unpack the Debian packages prepared by scripts/prepare_gpu_check.sh (.deps/gpu_check/debs)
#      into a private prefix with dpkg -x (never into /), relocating pkg-config files and Open MPI
#   2. configure + build against that machine's torch (alpaca-train and the gpu-labelled tests)
#   3. ctest -L gpu: the NCCL collectives, and the FSDP engine on the GPU with the collectives
#      forced at world 1 (fsdp_config force_collectives: every all-gather/reduce-scatter really goes
#      through NCCL); fp32 CUDA vs fp32 CPU, bf16 + offload + checkpointing vs fp32 CPU per
#      parameter; host synchronisations per optimizer step (util/host_sync.h); generation's cached
#      decode on CUDA vs the CPU (fp32 logits, greedy tokens; bf16)
#   4. one-rank NCCL training of ~1B and 7B LLaMA shapes (bf16, seq 2048, activation checkpointing,
#      with and without offload) with alpaca-train and PyTorch FSDP2: tokens/s, MFU, peak memory;
#      for 1B also the exposed communication time (forced collectives vs skipped), the planner's
#      memory (estimate-memory --json) vs the measured peak, host syncs per step
#   5. when the machine's CPU has AMX (the CPU the bf16 CPU speed goals of issue 32 are stated for)
#      and GPU_CHECK_CPU_BENCH_S > 0: bench/bench.py on it (small model, 2 ranks x 1 thread, bf16,
#      or GPU_CHECK_CPU_BENCH_DTYPES=bf16,fp32; ours vs PyTorch FSDP2 on CPU), in that many seconds
#      kept back from step 4 (bf16 alone needs ~120 s there: PyTorch's step is ~10 s)
# Results: $OUT/gpu_check.json (when OUT is set; else build-gpu/gpu_check.json), logs beside it.
#
#   bash scripts/gpu_check.sh              # GPU present: does it all; no GPU: dry run
#   bash scripts/gpu_check.sh --dry-run    # says what it would do and checks every prerequisite;
#                                          # also unpacks the packages and configures against them
# Exit status: 0 when every step ran (dry run: every prerequisite present), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
CPU_BENCH_S=${GPU_CHECK_CPU_BENCH_S:-0}
HAS_AMX=0
grep -qw amx_tile /proc/cpuinfo 2>/dev/null && HAS_AMX=1
DEPS=${GPU_CHECK_DEPS:-$ROOT/.deps/gpu_check}
PREFIX=${GPU_CHECK_PREFIX:-/tmp/alpaca-gpu-prefix}
BUILD=${GPU_CHECK_BUILD:-$ROOT/build-gpu}
RESULTS=${OUT:-$BUILD}
DRY=0
[[ ${1:-} == --dry-run ]] && DRY=1
PROBLEMS=()
elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[gpu_check +$(elapsed)s] $*"; }
problem() { PROBLEMS+=("$*"); say "PROBLEM: $*"; }
would() { say "would run: $*"; }

# ---- prerequisites ------------------------------------------------------------------------
PY=${GPU_CHECK_PYTHON:-python3}
[[ -x $ROOT/.venv/bin/python && -z ${GPU_CHECK_PYTHON:-} ]] && PY=$ROOT/.venv/bin/python
if TORCH_INFO=$("$PY" -c 'import torch,sys;print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count(), torch.utils.cmake_prefix_path)' 2>/dev/null); then
  read -r TORCH_VER TORCH_CUDA HAS_GPU NGPU TORCH_CMAKE <<<"$TORCH_INFO"
  say "python $PY: torch $TORCH_VER (CUDA $TORCH_CUDA), GPU available: $HAS_GPU ($NGPU)"
  [[ $TORCH_CUDA == None ]] && problem "torch $TORCH_VER has no CUDA: install a CUDA build of PyTorch"
else
  problem "no importable torch for $PY: set GPU_CHECK_PYTHON to the Python that holds PyTorch"
  HAS_GPU=False
fi
"$PY" -c 'import transformers' 2>/dev/null || problem "transformers is not importable by $PY (needed for the PyTorch FSDP reference)"
if command -v cmake >/dev/null; then
  CMV=$(cmake --version | head -1 | awk '{print $3}')
  say "cmake $CMV"
  [[ $(printf '%s\n3.25\n' "$CMV" | sort -V | head -1) == 3.25 ]] || problem "cmake $CMV is older than 3.25"
else problem "cmake not found (pip install cmake)"; fi
command -v ninja >/dev/null && say "ninja $(ninja --version)" || problem "ninja not found (pip install ninja)"
CXX_BIN=${CXX:-c++}
if command -v "$CXX_BIN" >/dev/null; then
  say "C++ compiler: $($CXX_BIN --version | head -1)"
  echo 'int main(){ return __cplusplus >= 202002L ? 0 : 1; }' > /tmp/gpu_check_cxx20.cpp
  "$CXX_BIN" -std=c++20 /tmp/gpu_check_cxx20.cpp -o /tmp/gpu_check_cxx20 2>/dev/null && /tmp/gpu_check_cxx20 \
    || problem "$CXX_BIN cannot compile C++20"
else problem "no C++ compiler ($CXX_BIN)"; fi
command -v nvidia-smi >/dev/null && say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
command -v dpkg >/dev/null || problem "dpkg not found: it unpacks the prepared packages (dpkg -x only)"
if [[ -f $DEPS/debs/PACKAGES ]]; then
  n_missing=0
  while read -r p; do ls "$DEPS/debs/${p}_"*.deb >/dev/null 2>&1 || { problem "package $p missing in $DEPS/debs"; n_missing=1; }; done < "$DEPS/debs/PACKAGES"
  say "$(ls "$DEPS"/debs/*.deb | wc -l) packages in $DEPS/debs ($(du -sh "$DEPS/debs" | cut -f1))"
else
  problem "$DEPS/debs/PACKAGES missing: run scripts/prepare_gpu_check.sh on a Debian 12 machine and carry .deps/gpu_check"
fi
for f in tokenizer.model data_2048.json data_2048.pt; do
  [[ -f $DEPS/data/$f ]] || problem "$DEPS/data/$f missing: run scripts/prepare_gpu_check.sh"
done
FREE_GB=$(df -Pk /tmp | awk 'NR==2{print int($4/1048576)}')
say "free disk under /tmp: ${FREE_GB} GiB (the 7B run writes ~14 GB of bf16 weights)"
((FREE_GB >= 20)) || problem "less than 20 GiB free under /tmp"

# ---- 1. unpack ----------------------------------------------------------------------------
unpack() {
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$PREFIX" || return 1; done
  # pkg-config files say prefix=/usr; point them at the private prefix.
  sed -i "s|^prefix=/usr\$|prefix=$PREFIX/usr|" "$PREFIX"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
  # Debian's alternatives are not set up by dpkg -x: name Open MPI's tools directly.
  ln -sf mpicc.openmpi "$PREFIX/usr/bin/mpicc"; ln -sf mpirun.openmpi "$PREFIX/usr/bin/mpirun"
  ln -sf orterun "$PREFIX/usr/bin/mpirun.openmpi" 2>/dev/null || true
}
export OPAL_PREFIX=$PREFIX/usr  # relocates Open MPI (wrappers, help files, plugins)
export PKG_CONFIG_PATH=$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PREFIX/usr/bin:$PATH
# Debian's PMIx looks for its plugins at its compiled-in path, where a GPU image may hold another
# PMIx's (seen on the H200 image: "undefined symbol: pmix_output_info", ignored by PMIx); keep
# that noise out of the logs, whose tails carry the errors that matter.
export PMIX_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
# The executables the gpu-labelled tests run: every argument of their commands that lies in the
# build tree (test names are not target names: an mpirun-wrapped suite, a launcher test). Read
# from CTestTestfile.cmake: before the build ctest leaves out the command of a missing executable.
gpu_test_executables() {  # $1: a configured build tree
  "$PY" - "$1" <<'PYEOF'
import os, re, sys
build = os.path.realpath(sys.argv[1])
names = set()
for root, _, files in os.walk(build):
    if "CTestTestfile.cmake" not in files:
        continue
    text = open(os.path.join(root, "CTestTestfile.cmake")).read()
    for test, args in re.findall(r'add_test\(\[=\[(.*?)\]=\] (.*?)\)\n', text):
        props = re.search(r'set_tests_properties\(\[=\[' + re.escape(test) + r'\]=\] PROPERTIES (.*?)\)\n', text)
        if props and re.search(r'LABELS "([^"]*;)?gpu(;[^"]*)?"', props.group(1)):
            names |= {os.path.basename(a) for a in re.findall(r'"([^"]*)"', args)
                      if os.path.realpath(a).startswith(build + "/")}
print(" ".join(sorted(names)))
PYEOF
}
CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DALPACA_PCH=ON
  "-DCMAKE_PREFIX_PATH=$PREFIX/usr;$PREFIX/usr/lib/x86_64-linux-gnu/cmake;$PREFIX/usr/share/cmake"
  "-DMPI_C_COMPILER=$PREFIX/usr/bin/mpicc.openmpi" "-DALPACA_PYTHON=$(command -v "$PY" || echo "$PY")"
  "-DTORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}" -DALPACA_WERROR=OFF)

if ((DRY)) || [[ ${HAS_GPU:-False} != True ]]; then
  ((DRY)) || say "no GPU visible to torch: dry run"
  if [[ -f $DEPS/debs/PACKAGES ]]; then
    say "unpacking into $PREFIX to check the packages are usable"
    unpack || problem "dpkg -x failed"
    for lib in "$PREFIX"/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40 "$PREFIX"/usr/lib/x86_64-linux-gnu/libsentencepiece.so.0 "$PREFIX"/usr/lib/x86_64-linux-gnu/libspdlog.so.1.10; do
      # Every library these need must come from the prefix or from the base set every CUDA image has.
      for need in $(objdump -p "$lib" 2>/dev/null | awk '/NEEDED/{print $2}'); do
        case $need in libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libz.so*|libdl.so*|libpthread.so*|librt.so*|libudev.so*|ld-linux*) continue;; esac
        find "$PREFIX" -name "$need" | grep -q . || problem "$(basename "$lib") needs $need, which is neither prepared nor in the base set"
      done
    done
    mpicc.openmpi --showme:compile >/dev/null 2>&1 && say "relocated Open MPI wrapper: $(mpicc.openmpi --showme)" || problem "relocated mpicc does not run"
    say "configuring $BUILD-dryrun against the prefix (checks that CMake finds every package there)"
    rm -rf "$BUILD-dryrun" && mkdir -p "$BUILD-dryrun"
    if cmake "${CMAKE_ARGS[@]}" -B "$BUILD-dryrun" > "$BUILD-dryrun/configure.log" 2>&1; then
      for v in nlohmann_json_DIR spdlog_DIR CLI11_DIR GTest_DIR MPI_C_HEADER_DIR SENTENCEPIECE_INCLUDEDIR Protobuf_PROTOC_EXECUTABLE \
               ALPACA_PROTOBUF_LITE_STATIC Boost_DIR PKG_CONFIG_EXECUTABLE PCRE2_INCLUDEDIR UTF8PROC_INCLUDEDIR XXHASH_INCLUDEDIR; do
        val=$(grep "^$v:" "$BUILD-dryrun/CMakeCache.txt" | cut -d= -f2-)
        [[ $val == "$PREFIX"* ]] && say "  $v = $val" || problem "CMake took $v from outside the prefix: '$val'"
      done
      GPU_TESTS=$(gpu_test_executables "$BUILD-dryrun")
      [[ -n $GPU_TESTS ]] && say "  the gpu tests' executables: $GPU_TESTS" || problem "no gpu-labelled test found in $BUILD-dryrun"
    else
      problem "configure against the prefix failed; see $BUILD-dryrun.log"
    fi
  fi
  # The packages must cover everything a build reads from /usr: the headers a local build's
  # depfiles name, the libraries on its link lines, the programs CMake ran (protoc, pkg-config,
  # mpicc). The GPU machine has the compiler's own set; anything else missing fails there, in
  # device time. (Configure alone cannot tell: here CMake also finds the system's copies.)
  LOCAL_BUILD=${GPU_CHECK_LOCAL_BUILD:-$ROOT/build}
  if [[ -f $LOCAL_BUILD/build.ninja && -f $LOCAL_BUILD/CMakeCache.txt ]] && command -v dpkg >/dev/null; then
    used=$( { ninja -C "$LOCAL_BUILD" -t deps 2>/dev/null | grep -oE '^[[:space:]]+/usr/[^ ]+'
              grep -oE '/usr/lib/x86_64-linux-gnu/[^ ]+[.](so|a)[.0-9]*' "$LOCAL_BUILD/build.ninja"
              grep -E '^(Protobuf_PROTOC_EXECUTABLE|PKG_CONFIG_EXECUTABLE|MPI_C_COMPILER):' "$LOCAL_BUILD/CMakeCache.txt" | cut -d= -f2-
            } | sed 's/^[[:space:]]*//' | grep -v '^/usr/local/' | sort -u | xargs -r readlink -f | sort -u)
    owners=$(echo "$used" | xargs -r -n 200 dpkg -S 2>/dev/null | cut -d: -f1 | tr ',' '\n' | tr -d ' ' | sed 's/:amd64$//' | sort -u)
    n_pkg=0
    for p in $owners; do
      case $p in libc6|libc6-dev|linux-libc-dev|libstdc++6|libstdc++-*-dev|libgcc-s1|libgcc-*-dev|zlib1g|zlib1g-dev) continue;; esac
      n_pkg=$((n_pkg + 1))
      grep -qx "$p" "$DEPS/debs/PACKAGES" || problem "a build reads files of Debian package $p ($LOCAL_BUILD), which scripts/prepare_gpu_check.sh does not fetch"
    done
    say "the $(echo "$used" | wc -l) files a local build read from /usr come from $n_pkg packages besides the compiler's; each is prepared or named above"
  else
    say "no local build in $LOCAL_BUILD (or no dpkg): cannot check the packages cover every header and library a build reads"
  fi
  would "cmake ${CMAKE_ARGS[*]}"
  would "ninja -C $BUILD alpaca-train <the gpu-labelled test executables>"
  would "ctest --test-dir $BUILD -L gpu --output-on-failure"
  "$PY" bench/gpu_bench.py plan --bin "$BUILD/alpaca-train" --data "$DEPS/data" --work /tmp/alpaca_gpu_bench
  would "$PY bench/gpu_bench.py run ... --out $RESULTS/gpu_check.json --figures $RESULTS/ctest_gpu.log  (whatever of the $BUDGET_S s budget is left)"
  say "the gpu tests print [gpu-figures] lines (per-parameter bf16+offload+checkpointing vs fp32 CPU, host syncs per step) that the JSON collects"
  if ((${#PROBLEMS[@]})); then say "dry run: ${#PROBLEMS[@]} problem(s):"; printf '  - %s\n' "${PROBLEMS[@]}"; exit 1; fi
  say "dry run: every prerequisite is present; on a GPU machine this script does the steps above"
  exit 0
fi

# ---- GPU run ------------------------------------------------------------------------------
((${#PROBLEMS[@]})) && { say "cannot run: ${#PROBLEMS[@]} problem(s)"; printf '  - %s\n' "${PROBLEMS[@]}"; exit 1; }
mkdir -p "$RESULTS"
STATUS=0
say "1. unpacking packages into $PREFIX"; unpack || exit 1
say "2. configure + build"
cmake "${CMAKE_ARGS[@]}" > "$RESULTS/configure.log" 2>&1 || { say "configure failed"; tail -30 "$RESULTS/configure.log"; exit 1; }
GPU_TESTS=$(gpu_test_executables "$BUILD")
say "   building alpaca-train, then the gpu tests' executables: $GPU_TESTS"
ninja -C "$BUILD" -j"$(nproc)" alpaca-train > "$RESULTS/build.log" 2>&1 || { say "build of alpaca-train failed"; grep -m20 -B2 -A8 "error" "$RESULTS/build.log"; exit 1; }
# A test executable that fails to build costs its tests, not the benchmarks.
ninja -C "$BUILD" -j"$(nproc)" -k 0 $GPU_TESTS >> "$RESULTS/build.log" 2>&1 || { STATUS=1; say "a gpu test failed to build"; grep -m20 -B2 -A8 "error" "$RESULTS/build.log"; }
say "3. ctest -L gpu ($GPU_TESTS)"
ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 120 > "$RESULTS/ctest_gpu.log" 2>&1 || STATUS=1
tail -15 "$RESULTS/ctest_gpu.log"
say "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) CPUs, AMX: $HAS_AMX"
((HAS_AMX)) || CPU_BENCH_S=0
LEFT=$(( BUDGET_S - $(elapsed) - CPU_BENCH_S ))
say "4. training benchmarks with ${LEFT} s left"
"$PY" bench/gpu_bench.py run --bin "$BUILD/alpaca-train" --data "$DEPS/data" --work /tmp/alpaca_gpu_bench \
  --out "$RESULTS/gpu_check.json" --budget_s "$LEFT" --figures "$RESULTS/ctest_gpu.log" 2>&1 | tee "$RESULTS/gpu_bench.log" || STATUS=1
if ((CPU_BENCH_S > 0)); then
  LEFT=$(( BUDGET_S - $(elapsed) ))
  say "5. CPU benchmark on this AMX CPU (issue 32), ${LEFT} s left"
  # 2 ranks x 1 thread, as the issue measured; 3 measured steps after 1 warm-up, one repetition a side.
  ALPACA_SHARED_DIR=$DEPS/cpu_bench ALPACA_TRAIN_BIN=$BUILD/alpaca-train timeout "$LEFT" \
    "$PY" bench/bench.py --sizes small --ranks 2 --dtypes "${GPU_CHECK_CPU_BENCH_DTYPES:-bf16}" --steps 4 --warmup 1 --reps 1 \
    --timeout "$LEFT" --out /tmp/alpaca_cpu_bench 2>&1 | tee "$RESULTS/cpu_bench.log" || STATUS=1
  for f in results.md results.json; do cp /tmp/alpaca_cpu_bench/$f "$RESULTS/cpu_bench_$f" 2>/dev/null; done
fi
say "done in $(elapsed) s; results in $RESULTS/gpu_check.json"
exit $STATUS
