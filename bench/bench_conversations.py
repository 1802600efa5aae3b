#!/usr/bin/env python3
"""Conversation preparation throughput (issue 28): rendering the chat template, tokenizing and
masking 20,000 conversations (the 5,000 shared Alpaca records, 4 times, as user/assistant
messages), ours (`alpaca-train preprocess --assistant_only_loss True`, its reported tokenize time)
vs transformers' `apply_chat_template(tokenize=True, return_dict=True,
return_assistant_tokens_mask=True)`, the call TRL's SFTTrainer makes per row with
assistant_only_loss, side by side in one run, one thread each. Template: trl's
qwen2_5_training.jinja (TRL needs {% generation %} markers); tokenizer: SmolLM2's. The ids and the
masks are checked equal.

    .venv/bin/python bench/bench_conversations.py [--alpaca_train build/alpaca-train] [--rows 20000]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def conversations(path, n):
    records = json.load(open(path, encoding="utf-8"))
    out = []
    while len(out) < n:
        for r in records[: n - len(out)]:
            user = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
            out.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": r["output"]}]})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alpaca_train", default=os.path.join(ROOT, "build", "alpaca-train"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "smollm2-135m-instruct"))
    ap.add_argument("--data_path", default=os.path.join(ROOT, "../shared/data/alpaca/alpaca_5000.json"))
    ap.add_argument("--rows", type=int, default=20000)
    args = ap.parse_args()
    import trl
    from transformers import AutoTokenizer
    template = os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5_training.jinja")
    src = open(template, encoding="utf-8").read()
    rows = conversations(args.data_path, args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "chats.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        out = os.path.join(tmp, "ours.jsonl")
        report = subprocess.run([args.alpaca_train, "preprocess", "--data_path", data, "--model_name_or_path", args.model,
                                 "--chat_template", template, "--assistant_only_loss", "True", "--num_threads", "1",
                                 "--model_max_length", "100000", "--output", out],
                                check=True, capture_output=True, text=True).stdout
        ours_s = float(re.search(r"tokenize ([0-9.e+-]+) s", report).group(1))
        ours = [json.loads(line) for line in open(out, encoding="utf-8")]
    tok = AutoTokenizer.from_pretrained(args.model)
    t0 = time.perf_counter()
    theirs = [tok.apply_chat_template(r["messages"], chat_template=src, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True) for r in rows]
    theirs_s = time.perf_counter() - t0
    same = all(o["input_ids"] == t["input_ids"] and [int(l != -100) for l in o["labels"]] == t["assistant_masks"]
               for o, t in zip(ours, theirs)) and len(ours) == len(theirs)
    print(f"{len(rows)} conversations: ours {ours_s:.2f} s ({len(rows) / ours_s:.0f}/s), transformers "
          f"{theirs_s:.2f} s ({len(rows) / theirs_s:.0f}/s), ratio {theirs_s / ours_s:.2f}x; "
          f"ids and masks identical: {same}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
