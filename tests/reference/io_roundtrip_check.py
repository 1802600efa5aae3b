#!/usr/bin/env python3
"""Loads directories written by alpaca-train with transformers' from_pretrained and checks that
each reproduces the logits our C++ model computed. Exit 0 when every check matches.

  io_roundtrip_check.py --check <hf dir> <expected.safetensors> <float32|bfloat16> <tol> [--check ...]
<expected> holds "input_ids", "attention_mask" and "logits"; only real (mask = 1) positions count.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", nargs=4, action="append", required=True, metavar=("DIR", "EXPECTED", "DTYPE", "TOL"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    ok = True
    for d, expected, dtype_name, tol in args.check:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
        model, info = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, output_loading_info=True)
        model.eval()
        model_type = json.loads((Path(d) / "config.json").read_text())["model_type"]
        want = ARCHITECTURES[model_type]
        assert type(model).__name__ == want, f"{d}: model_type {model_type} loaded as {type(model).__name__}, not {want}"
        # Every tensor we wrote is one transformers expects, and none is missing (e.g. qwen2's biases).
        assert not info["missing_keys"] and not info["unexpected_keys"], f"{d}: {info}"
        exp = load_file(expected)
        with torch.no_grad():
            logits = model(input_ids=exp["input_ids"], attention_mask=exp["attention_mask"]).logits.float()
        real = exp["attention_mask"].bool()
        diff = (logits - exp["logits"].float()).abs().amax(-1)[real].max().item()
        good = diff <= float(tol)
        ok = ok and good
        print(f"{'ok  ' if good else 'FAIL'} {d}: transformers vs ours logits max|diff| = {diff:.3g} "
              f"(dtype {dtype_name}, tol {tol})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
