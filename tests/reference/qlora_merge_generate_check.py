"""alpaca-train's `merge` and `generate --adapter` on a pre-quantized bitsandbytes 4-bit base
(tests/train/test_qlora_parity.cpp), against the Hugging Face stack on the CPU:

  merge:    transformers loads the *-bnb-4bit directory (bitsandbytes' Linear4bit), model.dequantize()
            turns every Linear4bit back into nn.Linear with bitsandbytes' dequantize_4bit weights,
            resize_token_embeddings(32001) as train.py, PeftModel.from_pretrained(...).merge_and_unload()
            (peft's merge on the dequantized base; on the 4-bit model itself peft would re-quantize the
            merged weight into 4 bits, which is not a bf16/fp32 HF directory). Compared tensor by tensor
            with --merged.
  generate: the 4-bit model (Linear4bit, compute float32) + PeftModel.from_pretrained (unmerged),
            generate(do_sample=False) on each --prompt (raw, the directory's tokenizer; train mode with
            every dropout 0, see generate()); also the
            smallest top-1/top-2 logit margin seen, so a near-tie is visible.

Prints one JSON line {"merged_max_abs_diff", "merged_tensors", "generation_ids", "min_margin"}.
"""
import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def load_4bit(base, vocab):
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, device_map="cpu")
    assert type(m.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    m.resize_token_embeddings(vocab)
    return m


def merged_diff(base, adapter, merged_dir, vocab):
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, device_map="cpu")
    m = m.dequantize()
    m.resize_token_embeddings(vocab)
    ref = PeftModel.from_pretrained(m, adapter).merge_and_unload().state_dict()
    ours = load_file(os.path.join(merged_dir, "model.safetensors"))
    assert set(ours) == set(ref), (sorted(set(ours) ^ set(ref)))
    return max((ours[k].float() - ref[k].float()).abs().max().item() for k in ours), len(ours)


def generate(base, adapter, prompts, new_tokens, vocab):
    # Train mode (every dropout here is 0, so the same function): in eval mode on an AVX512-BF16 CPU,
    # Linear4bit repacks its weight for a CPU GEMM that needs widths divisible by its block (64 x 100
    # is not) instead of dequantizing; dequantize_4bit then matmul is what it computes otherwise.
    model = PeftModel.from_pretrained(load_4bit(base, vocab), adapter).train()
    tok = AutoTokenizer.from_pretrained(adapter if os.path.exists(os.path.join(adapter, "tokenizer.model")) else base)
    out, margin = [], float("inf")
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            g = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, output_scores=True,
                               return_dict_in_generate=True, pad_token_id=2)
        for s in g.scores:
            top = torch.topk(s[0].float(), 2).values
            margin = min(margin, (top[0] - top[1]).item())
        out.append(g.sequences[0, ids.shape[1]:].tolist())
    return out, margin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--merged", required=True)
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--max_new_tokens", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32001)
    args = ap.parse_args()
    torch.manual_seed(0)
    diff, n = merged_diff(args.base, args.adapter, args.merged, args.vocab)
    gens, margin = generate(args.base, args.adapter, args.prompt, args.max_new_tokens, args.vocab)
    print(json.dumps({"merged_max_abs_diff": diff, "merged_tensors": n, "generation_ids": gens, "min_margin": margin}))


if __name__ == "__main__":
    main()
