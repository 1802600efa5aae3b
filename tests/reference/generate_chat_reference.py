#!/usr/bin/env python3
"""Reference for `alpaca-train generate --chat` (tests/generate/test_generate_chat.cpp): for
SmolLM2-135M-Instruct (scripts/make_smollm2.py) and a few OpenAI message lists (a bare user turn, a
system prompt, a multi-turn conversation), transformers' greedy fp32
model.generate(tokenizer.apply_chat_template(msgs, add_generation_prompt=True)), one prompt at a
time with the model's generation_config.json. Writes <out>/prompts.jsonl (the message records the
CLI reads) and <out>/reference.json: the templated prompt ids, the new ids (through the EOS) and the
smallest top-1/top-2 logit margin (how close a tie came). Template variables (apply_chat_template's
kwargs): <out>/kwargs_prompts.jsonl, records with `tools` / `chat_template_kwargs` rendered by TRL's
copy of Qwen3's template (<out>/qwen3.jinja, whose enable_thinking=False writes an empty think block
into the generation prompt), their texts and ids, and the greedy answer to the first with
enable_thinking=False given as the CLI's --chat_template_kwargs. Without the model: <out>/SKIPPED.

  .venv/bin/python tests/reference/generate_chat_reference.py --out build/fixtures/generate_chat_ref
"""
import argparse
import json
import os
from pathlib import Path

import torch
import trl
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
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
KWARGS_RECORDS = [
    {"messages": CONVERSATIONS[0], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": CONVERSATIONS[0], "chat_template_kwargs": {"enable_thinking": True}},
    {"messages": CONVERSATIONS[2], "tools": [WEATHER_TOOL], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": CONVERSATIONS[1], "tools": [WEATHER_TOOL], "chat_template_kwargs": {"tools": None}},
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
    qwen3 = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text(encoding="utf-8")
    (out / "qwen3.jinja").write_text(qwen3, encoding="utf-8")
    (out / "kwargs_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in KWARGS_RECORDS))
    kw_texts, kw_ids = [], []
    for r in KWARGS_RECORDS:
        kwargs = {"tools": r.get("tools"), **r["chat_template_kwargs"]}  # as TRL merges them
        kw_texts.append(tok.apply_chat_template(r["messages"], chat_template=qwen3, add_generation_prompt=True,
                                                tokenize=False, **kwargs))
        kw_ids.append(tok.apply_chat_template(r["messages"], chat_template=qwen3, add_generation_prompt=True,
                                              return_dict=True, **kwargs)["input_ids"])
    ids = tok.apply_chat_template(CONVERSATIONS[0], chat_template=qwen3, add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True, enable_thinking=False)
    with torch.no_grad():
        g = model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    kw_new = g[0, ids["input_ids"].shape[1]:].tolist()
    (out / "prompts.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    (out / "reference.json").write_text(json.dumps({
        "model_dir": str(model_dir), "max_new_tokens": NEW_TOKENS, "prompt_ids": prompts, "new_ids": news,
        "min_margin": margin, "kwargs_texts": kw_texts, "kwargs_ids": kw_ids, "kwargs_new_ids": kw_new,
        "texts": [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in CONVERSATIONS]}))
    print(f"generate_chat: {len(news)} conversations, {sum(map(len, news))} new tokens, "
          f"min top-2 margin {margin:.4g}")


if __name__ == "__main__":
    main()
