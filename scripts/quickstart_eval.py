#!/usr/bin/env python3
"""Evidence for the quick start that the model learned: held-out loss (train.py's masking) and
exact-match accuracy of greedy answers on the held-out split, for one HF model directory.

  .venv/bin/python scripts/quickstart_eval.py --model out/quickstart/model --data data/synthetic_eval.json
Prints a few example answers and one JSON line {"loss": ..., "exact_match": ..., "n": ...}.
"""
import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from make_data import PROMPT_INPUT as P_IN, PROMPT_NO_INPUT as P_NO  # noqa: E402  (train.py's prompts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", default=None, help="tokenizer.model (default: the model dir's)")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--show", type=int, default=4)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    torch.set_num_threads(2)
    sp = spm.SentencePieceProcessor(model_file=args.tokenizer or os.path.join(args.model, "tokenizer.model"))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    records = json.load(open(args.data))[: args.n]
    prompt = lambda r: (P_IN if r.get("input", "") else P_NO).format_map(r)
    total, count, correct = 0.0, 0, 0
    with torch.no_grad():
        for i, r in enumerate(records):
            src = [sp.bos_id()] + sp.encode(prompt(r))
            full = [sp.bos_id()] + sp.encode(prompt(r) + r["output"]) + [sp.eos_id()]
            labels = torch.tensor([-100] * len(src) + full[len(src):])
            logits = model(input_ids=torch.tensor([full])).logits[0].float()
            total += torch.nn.functional.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum").item()
            count += int((labels[1:] != -100).sum())
            out = model.generate(torch.tensor([src]), max_new_tokens=16, do_sample=False, eos_token_id=sp.eos_id(),
                                 pad_token_id=sp.eos_id())
            answer = sp.decode([t for t in out[0, len(src):].tolist() if t < sp.get_piece_size()]).strip()
            correct += answer == r["output"]
            if i < args.show:
                print(f"  {args.label:>7} | {r['instruction'][:48]!r:52} {r.get('input', '')[:20]!r:24} -> {answer!r} "
                      f"(expected {r['output']!r})")
    print(json.dumps({"label": args.label, "loss": total / max(count, 1), "exact_match": correct / len(records),
                      "n": len(records)}))


if __name__ == "__main__":
    main()
