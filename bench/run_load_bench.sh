#!/usr/bin/env bash
# Load time and peak host memory for a randomly initialised ~1.1B-parameter LLaMA (TinyLlama
# shape), ours vs transformers, each in a fresh process. Not part of ctest (needs ~5 GiB RAM).
#   bench/run_load_bench.sh [build_dir] [work_dir]
# The page cache is warm for both (the file was just written), so this compares CPU work and
# memory, not disk speed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
work="${2:-$build/bench_tmp}"
py="$root/.venv/bin/python"
bin="$build/tests/io/bench_hf_load"
[[ -x "$bin" ]] || { echo "build it first: ninja -C $build bench_hf_load" >&2; exit 1; }
mkdir -p "$work"
ckpt="$work/llama_1b"
[[ -d "$ckpt" ]] || OMP_NUM_THREADS=2 "$bin" create "$root/bench/llama_1b.json" "$ckpt" bfloat16
du -sh "$ckpt"
export OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
for dtype in float32 bfloat16; do
  "$bin" load "$ckpt" "$dtype"
  "$py" "$root/bench/hf_load_transformers.py" "$ckpt" "$dtype" 2>/dev/null
done
"$bin" load "$ckpt" bfloat16 zero_copy
