"""Loads an alpaca-train LoRA output directory the way a peft user does and compares its logits
with alpaca-train's (tests/train/test_lora_parity). The user's lines are exactly:

    base = AutoModelForCausalLM.from_pretrained(BASE)
    base.resize_token_embeddings(32001)              # len(tokenizer) after train.py's [PAD]
    model = PeftModel.from_pretrained(base, ADAPTER)  # the adapter restores the [PAD] rows

Any warning while loading (missing / unexpected adapter keys, or anything else peft or
transformers warns about) fails the check. Prints one JSON line {"max_abs_diff", "max_abs",
"warnings"}; exit status 1 on a warning.

  python lora_peft_load_check.py --base <hf dir> --adapter <dir> --ours <logits.safetensors>
"""
import argparse
import json
import logging
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--vocab", type=int, default=32001)
    ap.add_argument("--merged", help="also load this merged HF directory (alpaca-train merge) and compare its logits")
    args = ap.parse_args()
    ours = load_file(args.ours)
    merged_diff = None
    if args.merged:
        merged = AutoModelForCausalLM.from_pretrained(args.merged, dtype=torch.float32).eval()
        with torch.no_grad():
            merged_diff = (merged(input_ids=ours["input_ids"]).logits.float() - ours["logits"]).abs().max().item()
    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32)
    base.resize_token_embeddings(args.vocab, mean_resizing=False)  # any values: the adapter overwrites the new rows
    handler = Collect()
    for name in ("peft", "transformers"):
        logging.getLogger(name).addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, args.adapter)
    found = [str(w.message) for w in caught if "deprecated" not in str(w.message)] + handler.records
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ours["input_ids"]).logits.float()
    diff = (logits - ours["logits"]).abs().max().item()
    print(json.dumps({"max_abs_diff": diff, "max_abs": ours["logits"].abs().max().item(), "warnings": found,
                      "merged_max_abs_diff": merged_diff}))
    raise SystemExit(1 if found else 0)


if __name__ == "__main__":
    main()
