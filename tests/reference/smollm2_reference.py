"""Reference for the SmolLM2 tests (issue 14): a real pretrained LLaMA-architecture model.

  --out DIR            makes models/smollm2-135m-instruct (scripts/make_smollm2.py, idempotent),
                       writes DIR/train.json and DIR/eval.json (real Alpaca records) and
                       DIR/reference.json: transformers' fp32 eval loss of the untouched model on
                       eval.json (train.py's preprocess; the loss averaged over every label token
                       of the set, as our trainer reports it) and the eval examples' input ids.
  --check_export DIR   loads an exported directory with AutoModelForCausalLM / AutoTokenizer and
                       prints {"eval_loss": ..., "input_ids": [...], "len": ...} for eval.json.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(REPO, "models/smollm2-135m-instruct")
sys.path.insert(0, os.path.join(REPO, "scripts"))
from make_data import PROMPT_INPUT, PROMPT_NO_INPUT  # noqa: E402  (train.py's templates)


def examples(tok, records, max_len=512):
    out = []
    for r in records:
        source = (PROMPT_INPUT if r.get("input", "") else PROMPT_NO_INPUT).format_map(r)
        full = tok(source + r["output"] + tok.eos_token, max_length=max_len, truncation=True)["input_ids"]
        n = len(tok(source, max_length=max_len, truncation=True)["input_ids"])
        out.append((full, [-100] * min(n, len(full)) + full[n:]))
    return out


EVAL_BATCH = 4  # test_smollm2.cpp's --per_device_eval_batch_size


@torch.no_grad()
def eval_loss(model_dir, records):
    """transformers' eval_loss (Trainer.evaluation_loop): each batch of EVAL_BATCH consecutive
    records has the mean loss over its label tokens, repeated once per record; eval_loss is the
    mean of those. Padding changes no token's loss, so each record runs alone here."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sums, counts, ids = [], [], []
    for full, labels in examples(tok, records):
        logits = model(torch.tensor([full])).logits[0, :-1].float()
        target = torch.tensor(labels[1:])
        sums.append(torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction="sum").item())
        counts.append(int((target != -100).sum()))
        ids.append(full)
    per_record = []
    for b in range(0, len(sums), EVAL_BATCH):
        mean = sum(sums[b:b + EVAL_BATCH]) / sum(counts[b:b + EVAL_BATCH])
        per_record += [mean] * len(sums[b:b + EVAL_BATCH])
    return sum(per_record) / len(per_record), ids, len(tok)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check_export")
    ap.add_argument("--eval_json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.check_export:
        records = json.load(open(args.eval_json))
        loss, ids, n = eval_loss(args.check_export, records)
        print(json.dumps({"eval_loss": loss, "input_ids": ids, "len": n}))
        return
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(REPO, "../shared"))
    data = os.path.join(shared, "data/alpaca/alpaca_5000.json")
    os.makedirs(args.out, exist_ok=True)
    if not os.path.exists(data):
        open(os.path.join(args.out, "SKIPPED"), "w").write("no shared data\n")
        return
    subprocess.check_call([sys.executable, os.path.join(REPO, "scripts/make_smollm2.py")])
    records = json.load(open(data))
    short = [r for r in records if len(r["instruction"]) + len(r.get("input", "")) + len(r["output"]) < 400]
    train, evals = short[:64], short[64:80]
    json.dump(train, open(os.path.join(args.out, "train.json"), "w"))
    json.dump(evals, open(os.path.join(args.out, "eval.json"), "w"))
    loss, ids, n = eval_loss(MODEL, evals)
    json.dump({"model": MODEL, "eval_loss": loss, "input_ids": ids, "len": n},
              open(os.path.join(args.out, "reference.json"), "w"))
    print(f"SmolLM2 untouched fp32 eval loss on {len(evals)} Alpaca records: {loss:.6f}")


if __name__ == "__main__":
    main()
