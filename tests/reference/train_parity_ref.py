"""Reference trainer for tests/train/test_train_parity: the math of Hugging Face Trainer on
Stanford Alpaca's recipe, written out with transformers' LlamaForCausalLM, torch.optim.AdamW and
transformers.get_scheduler, on the same tiny model, data and example order as alpaca-train.

Writes into --out:
  model/           the tiny random LLaMA (HF dir, fp32 safetensors, LLaMA-2 tokenizer.model)
  data.json        the Alpaca records both sides train on
  reference.json   {"losses": [...], "learning_rates": [...], "grad_norms": [...], "config": {...}}

The model, data, preprocessing and the step loop (and why their semantics are ours) are
alpaca_reference.py's, shared with lora_parity_ref.py.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alpaca_reference as ref  # noqa: E402
from alpaca_reference import tokenize  # noqa: E402,F401  (train_e2e_check.py imports it from here)


def main():
    ap = argparse.ArgumentParser()
    ref.add_common_args(ap, steps=30, lr=1e-3)
    parsed = ref.parse_inputs(ap)
    if parsed is None:
        return
    args, out, tok_path, alpaca = parsed
    model = ref.save_tiny_model(out / "model", tok_path)
    examples = ref.load_examples(out, alpaca, tok_path, args)
    ref.add_pad_row(model)
    losses, lrs, norms = ref.train(model, list(model.named_parameters()), examples, args)
    ref.write_reference(out, losses, lrs, norms, args)


if __name__ == "__main__":
    main()
