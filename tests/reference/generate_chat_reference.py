#!/usr/bin/env python3
"""Reference for `alpaca-train generate --chat` (tests/generate/test_generate_chat.cpp): for
SmolLM2-135M-Instruct (scripts/make_smollm2.py) and a few OpenAI message lists (a bare user turn, a
system prompt, a multi-turn conversation), transformers' greedy fp32
model.generate(tokenizer.apply_chat_template(msgs, add_generation_prompt=True)), one prompt at a
time with the model's generation_config.json. Writes <out>/prompts.jsonl (the message records the
CLI reads) and <out>/reference.json: the templated prompt ids, the new ids (through the EOS) and the
smallest top-1/top-2 logit margin (how close a tie came). Without the model: <out>/SKIPPED.

  .venv/bin/python tests/reference/generate_chat_reference.py --out build/fixtures/generate_chat_ref
"""
import argparse
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
NEW_TOKENS = 24
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant. Answer in one word."},
     {"role": "user", "content": "Name a primary colour."}],
    [{"role": "user", "content": "Give me a number between 1 and 10."},
     {"role": "assistant", "content": "7"},
     {"role": "user", "content": "Now double it and explain."}],
    [{"role": "user", "content": "Translate to French: good morning, friend — café?"}],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smollm2", default=str(REPO / "models" / "smollm2-135m-instruct"))
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.smollm2)
    if not (model_dir / "config.json").exists():
        (out / "SKIPPED").write_text(f"{model_dir} not found; run scripts/make_smollm2.py\n")
        print(f"generate_chat: {model_dir} not found (run scripts/make_smollm2.py); skipped")
        return
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    prompts, news, margin = [], [], float("inf")
    for msgs in CONVERSATIONS:
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            g = model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                               output_logits=True)
        n = ids["input_ids"].shape[1]
        prompts.append(ids["input_ids"][0].tolist())
        news.append(g.sequences[0, n:].tolist())
        for s in g.logits:
            top2 = s[0].float().topk(2).values
            margin = min(margin, float(top2[0] - top2[1]))
    (out / "prompts.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    (out / "reference.json").write_text(json.dumps({
        "model_dir": str(model_dir), "max_new_tokens": NEW_TOKENS, "prompt_ids": prompts, "new_ids": news,
        "min_margin": margin,
        "texts": [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in CONVERSATIONS]}))
    print(f"generate_chat: {len(news)} conversations, {sum(map(len, news))} new tokens, "
          f"min top-2 margin {margin:.4g}")


if __name__ == "__main__":
    main()
