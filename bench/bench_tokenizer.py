#!/usr/bin/env python3
"""Tokenization throughput with a tokenizer.json BPE: ours vs the `tokenizers` library (Rust), side
by side in one run, on train.py's texts (prompt + output + EOS) of the 5,000 shared Alpaca records.
Both sides encode with add_special_tokens=True; best of 3; the ids are checked equal.

    .venv/bin/python bench/bench_tokenizer.py [--build build] [--tokenizer models/smollm2-135m-instruct]
        [--threads 1]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from make_data import PROMPT_INPUT, PROMPT_NO_INPUT  # noqa: E402  (train.py's templates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models/smollm2-135m-instruct"))
    ap.add_argument("--data_path", default=os.path.join(ROOT, "../shared/data/alpaca/alpaca_5000.json"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its pool
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(args.tokenizer).eos_token
    records = json.load(open(args.data_path))
    texts = [(PROMPT_INPUT if r.get("input", "") else PROMPT_NO_INPUT).format_map(r) + r["output"] + eos
             for r in records]
    with tempfile.TemporaryDirectory() as tmp:
        tf = os.path.join(tmp, "texts.json")
        json.dump(texts, open(tf, "w"))
        ids_file = os.path.join(tmp, "ids.json")
        out = subprocess.run([os.path.join(args.build, "tests/tokenizer/bench_tokenizer"), args.tokenizer, tf,
                              str(args.threads), ids_file], check=True, capture_output=True, text=True).stdout
        ours = json.loads(out.strip().splitlines()[-1])
        our_ids = json.load(open(ids_file))

    lib = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        enc = lib.encode_batch(texts, add_special_tokens=True)
        best = min(best, time.perf_counter() - t0)
    lib_ids = [e.ids for e in enc]
    same = sum(a == b for a, b in zip(our_ids, lib_ids))
    tokens = sum(len(x) for x in lib_ids)
    import tokenizers
    print(f"tokenizer: {args.tokenizer} ({len(texts)} texts, {tokens} tokens, {args.threads} thread(s))")
    print(f"  ours                      {ours['seconds']:.3f} s  {ours['texts_per_s']:9.0f} texts/s  "
          f"{ours['tokens_per_s']:10.0f} tokens/s")
    print(f"  tokenizers {tokenizers.__version__:<14} {best:.3f} s  {len(texts) / best:9.0f} texts/s  "
          f"{tokens / best:10.0f} tokens/s  (encode_batch)")
    print(f"  ratio ours/tokenizers: {best / ours['seconds']:.2f}x throughput; identical ids: {same}/{len(texts)}")
    return 0 if same == len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
