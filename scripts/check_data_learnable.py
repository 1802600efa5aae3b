#!/usr/bin/env python3
"""Sanity check that the default synthetic data (data/) is learnable by a tiny LLaMA on a CPU in
minutes: trains transformers' LlamaForCausalLM with Alpaca's preprocessing (prompt masked, target
= output + </s>) and reports the loss curve and exact-match accuracy of greedy answers on the
held-out split. Not a test (it takes minutes); the C++ trainer's quick start should do as well.

    .venv/bin/python scripts/check_data_learnable.py --steps 600
"""
import argparse
import json
import os
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
import sentencepiece as spm

from make_data import PROMPT_INPUT as P_IN, PROMPT_NO_INPUT as P_NO  # train.py's prompts

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(root, "data/tokenizer/tokenizer.model"))
    train = json.load(open(os.path.join(root, "data/synthetic_train.json")))
    held = json.load(open(os.path.join(root, "data/synthetic_eval.json")))[: args.eval]
    prompt = lambda r: (P_IN if r["input"] else P_NO).format_map(r)
    pad = sp.get_piece_size()  # [PAD] = 512
    examples = []
    for r in train:
        src = [1] + sp.encode(prompt(r))
        full = [1] + sp.encode(prompt(r) + r["output"]) + [2]
        examples.append((full, [-100] * len(src) + full[len(src):]))
    cfg = LlamaConfig(vocab_size=pad + 1, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      pad_token_id=pad, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30) * max(0.05, 1 - s / args.steps))
    rng = random.Random(0)
    t0 = time.time()
    for step in range(args.steps):
        batch = rng.sample(examples, args.batch)
        T = max(len(x) for x, _ in batch)
        ids = torch.tensor([x + [pad] * (T - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (T - len(y)) for _, y in batch])
        loss = model(input_ids=ids, attention_mask=ids.ne(pad), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    correct = 0
    per_task = {}
    with torch.no_grad():
        for r in held:
            ids = torch.tensor([[1] + sp.encode(prompt(r))])
            out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=2, pad_token_id=pad)
            answer = sp.decode(out[0, ids.shape[1]:].tolist())
            ok = answer.strip() == r["output"]
            correct += ok
            task = " ".join(r["instruction"].split()[:2])
            hit, total = per_task.get(task, (0, 0))
            per_task[task] = (hit + ok, total + 1)
    for task, (hit, total) in sorted(per_task.items()):
        print(f"  {task:<24} {hit}/{total}")
    print(f"held-out exact match: {correct}/{len(held)} = {correct / len(held):.1%} after {args.steps} steps, "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
