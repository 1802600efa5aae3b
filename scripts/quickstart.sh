#!/usr/bin/env bash
# Quick start: set up, build, make the tiny default model, fine-tune it on the bundled synthetic
# Alpaca-format data with 2 CPU ranks under mpirun, and show that it learned (held-out loss and
# exact-match answers before and after; metrics.png of the run is drawn and its path printed).
# A few minutes on a laptop-class CPU.
#
#   bash scripts/quickstart.sh            # everything
#   QUICKSTART_EPOCHS=1 bash scripts/quickstart.sh   # shorter
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${ALPACA_BUILD_DIR:-build}
JOBS=${ALPACA_JOBS:-$(nproc)}
OUT=${QUICKSTART_OUT:-out/quickstart}
EPOCHS=${QUICKSTART_EPOCHS:-5}
RANKS=${QUICKSTART_RANKS:-2}

bash scripts/install_deps.sh
echo "[quickstart] configuring and building $BUILD/alpaca-train (-j $JOBS)"
[ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j "$JOBS" --target alpaca-train
BIN=$BUILD/alpaca-train
PY=.venv/bin/python

# 1. The tiny default model: LLaMA-shaped, 4 layers of width 128, the bundled 512-piece tokenizer.
mkdir -p "$OUT"
cat > "$OUT/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 128,
 "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "bos_token_id": 1,
 "eos_token_id": 2, "tie_word_embeddings": false, "hidden_act": "silu", "initializer_range": 0.02}
JSON
"$BIN" init-model --config "$OUT/config.json" --output_dir "$OUT/base" --seed 0
cp data/tokenizer/* "$OUT/base/"
echo "[quickstart] initialised $OUT/base"

# 2. Before: held-out loss and exact match of the random model.
"$PY" scripts/quickstart_eval.py --model "$OUT/base" --data data/synthetic_eval.json --label before | tee "$OUT/before.txt"

# 3. Fine-tune: the Alpaca recipe's flags, sized for a CPU (global batch 32, lr 3e-3, cosine).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
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
echo "[quickstart] TensorBoard: .venv/bin/tensorboard --logdir $OUT/model/runs"

# 4. After: the same evaluation on the fine-tuned model (loaded by transformers).
"$PY" scripts/quickstart_eval.py --model "$OUT/model" --data data/synthetic_eval.json --label after | tee "$OUT/after.txt"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
b = json.loads(open(f"{out}/before.txt").read().strip().splitlines()[-1])
a = json.loads(open(f"{out}/after.txt").read().strip().splitlines()[-1])
print(f"[quickstart] held-out loss {b['loss']:.3f} -> {a['loss']:.3f}; "
      f"exact match {b['exact_match']:.0%} -> {a['exact_match']:.0%} on {a['n']} held-out instructions")
PYEOF
