"""Loads a trained alpaca-train output directory with transformers and compares its loss on
held-out Alpaca records with the starting checkpoint's (tests/e2e). Prints one JSON line:
{"start_loss": ..., "final_loss": ..., "final_vocab": ..., "tokenizer_loaded": bool}

  python train_e2e_check.py --start <hf dir> --final <output_dir> --data heldout.json --max_len 512
"""
import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from train_parity_ref import tokenize  # noqa: E402


def eval_loss(model, examples, pad_id):
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in examples:
            x = torch.tensor([ids])
            y = torch.tensor([labels])
            logits = model(input_ids=x).logits.float()
            total += torch.nn.functional.cross_entropy(logits[0, :-1], y[0, 1:], ignore_index=-100, reduction="sum").item()
            count += int((y[0, 1:] != -100).sum())
    return total / max(count, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--start", required=True)
    ap.add_argument("--final", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--max_len", type=int, default=512)
    args = ap.parse_args()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.final, "tokenizer.model"))
    examples = tokenize(json.load(open(args.data)), sp, args.max_len)
    start = AutoModelForCausalLM.from_pretrained(args.start, dtype=torch.float32)
    final = AutoModelForCausalLM.from_pretrained(args.final, dtype=torch.float32)
    # The starting checkpoint gets train.py's [PAD] row (mean of the old rows) so both softmaxes
    # cover the same vocabulary.
    if start.config.vocab_size != final.config.vocab_size:
        with torch.no_grad():
            old_in = start.get_input_embeddings().weight.clone()
            old_out = start.get_output_embeddings().weight.clone()
            start.resize_token_embeddings(final.config.vocab_size, mean_resizing=False)
            start.get_input_embeddings().weight[old_in.shape[0]:] = old_in.mean(0)
            start.get_output_embeddings().weight[old_out.shape[0]:] = old_out.mean(0)
    tok_ok = True
    try:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(args.final)
    except Exception as e:  # reported, not fatal: the weights are what this check is about
        tok_ok = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps({"start_loss": eval_loss(start, examples, 32000), "final_loss": eval_loss(final, examples, 32000),
                      "final_vocab": final.config.vocab_size, "tokenizer_loaded": tok_ok}))


if __name__ == "__main__":
    main()
