#!/usr/bin/env python3
"""Reference fixtures for the C++ generation tests (tests/generate/test_generate_parity.cpp).

1. Greedy parity. For a tiny random LLaMA made by `alpaca-train init-model` (GQA, two EOS ids) and,
   when present, SmolLM2-135M-Instruct (scripts/make_smollm2.py), transformers' generate
   (do_sample=False, fp32, sdpa, KV cache) on 20 prompts x 32 new tokens, once as one left-padded
   batch of 20 and once one prompt at a time. Tiny: random token-id prompts of 3..24 tokens.
   SmolLM2: the first 20 held-out Alpaca instructions (data/synthetic_eval.json) in train.py's
   template, tokenized by SmolLM2's own tokenizer (tokenizer.json). Written to
   <out>/<model>/greedy.json: prompts, the new ids of each prompt (trailing pads after EOS cut),
   and the reference's smallest top-1/top-2 logit margin over all steps (how close a tie came).
2. Logits processors. Fixed random logits (with deliberate ties) and token histories through
   transformers' RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
   TopPLogitsWarper and the sampling chain generate() builds from them:
   <out>/processors.safetensors.

  .venv/bin/python tests/reference/generate_reference.py --out build/fixtures/generate
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.logits_process import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from make_data import PROMPT_INPUT, PROMPT_NO_INPUT  # noqa: E402  (train.py's templates)

NUM_PROMPTS, NEW_TOKENS = 20, 32
# SmolLM2 decodes one token in ~0.1 s on an AVX2-only CPU (fp32 module path): 12 of its prompts keep
# the batched-vs-one-by-one and padding checks (the test takes the first 8, 5 and 4) at 40% less time.
SMOLLM2_PROMPTS = 12
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "bos_token_id": 1,
    "eos_token_id": [2, 3], "pad_token_id": 0, "tie_word_embeddings": False, "hidden_act": "silu",
    # Wider than transformers' 0.02 so a random model's logits have clear winners (no near-ties).
    "initializer_range": 0.25,
}


def new_ids(row, prompt_len, eos):
    out = row[prompt_len:].tolist()
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out


def left_padded(group, pad):
    """(ids, attention mask) of a batch of prompts, left-padded as generate() wants for decoder-only models."""
    t = max(len(p) for p in group)
    ids = torch.full((len(group), t), pad, dtype=torch.long)
    mask = torch.zeros((len(group), t), dtype=torch.long)
    for r, p in enumerate(group):
        ids[r, t - len(p):] = torch.tensor(p)
        mask[r, t - len(p):] = 1
    return ids, mask


def greedy(model, prompts, eos, pad, batched, new_tokens=NEW_TOKENS):
    """New ids per prompt and the smallest top-2 margin of the reference's logits."""
    results, margin = [], float("inf")
    groups = [prompts] if batched else [[p] for p in prompts]
    for group in groups:
        ids, mask = left_padded(group, pad)
        t = ids.shape[1]
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad, return_dict_in_generate=True,
                                 output_logits=True)
        for r in range(len(group)):
            ids_r = new_ids(out.sequences[r], t, eos)
            results.append(ids_r)
            for s in range(len(ids_r)):
                top2 = out.logits[s][r].float().topk(2).values
                margin = min(margin, float(top2[0] - top2[1]))
    return results, margin


def write_greedy(out_dir, model_dir, prompts, eos, pad, extra):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    batched, m_b = greedy(model, prompts, eos, pad, batched=True)
    single, m_s = greedy(model, prompts, eos, pad, batched=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    rec = {"model_dir": str(model_dir), "max_new_tokens": NEW_TOKENS, "eos_token_id": eos, "pad_token_id": pad,
           "prompts": prompts, "batched": batched, "single": single, "min_margin_batched": m_b,
           "min_margin_single": m_s, **extra}
    (out_dir / "greedy.json").write_text(json.dumps(rec))
    stopped = sum(1 for g in single if g and g[-1] in eos)
    same = sum(1 for a, b in zip(batched, single) if a == b)
    print(f"{out_dir.name}: {len(prompts)} prompts, {stopped} stop at EOS, batched == single for {same}, "
          f"min top-2 margin {min(m_b, m_s):.4g}")


def tiny(out_root, train_bin):
    d = out_root / "tiny"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    subprocess.run([train_bin, "init-model", "--config", str(d / "config.json"), "--output_dir", str(d / "model"),
                    "--seed", "3"], check=True)
    gen = torch.Generator().manual_seed(5)
    prompts = []
    for _ in range(NUM_PROMPTS):
        n = int(torch.randint(3, 25, (1,), generator=gen))
        prompts.append([1] + torch.randint(4, TINY_CONFIG["vocab_size"], (n - 1,), generator=gen).tolist())
    write_greedy(d, d / "model", prompts, TINY_CONFIG["eos_token_id"], TINY_CONFIG["pad_token_id"], {})


def smollm2(out_root, model_dir):
    d = out_root / "smollm2"
    if not (Path(model_dir) / "config.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        (d / "SKIPPED").write_text(f"{model_dir} not found; run scripts/make_smollm2.py\n")
        print(f"smollm2: {model_dir} not found (run scripts/make_smollm2.py); skipped")
        return
    tok = AutoTokenizer.from_pretrained(model_dir)
    gcfg = json.loads((Path(model_dir) / "generation_config.json").read_text())
    eos = gcfg["eos_token_id"] if isinstance(gcfg["eos_token_id"], list) else [gcfg["eos_token_id"]]
    pad = gcfg.get("pad_token_id", tok.pad_token_id)
    pad = eos[0] if pad is None else pad
    records = json.loads((REPO / "data" / "synthetic_eval.json").read_text())[:SMOLLM2_PROMPTS]
    texts = [(PROMPT_INPUT if r.get("input") else PROMPT_NO_INPUT).format_map(r) for r in records]
    prompts = [tok(t)["input_ids"] for t in texts]
    write_greedy(d, model_dir, prompts, eos, pad, {"texts": texts})


def processors(out_root):
    gen = torch.Generator().manual_seed(11)
    b, v = 4, 100
    scores = torch.randn(b, v, generator=gen) * 3
    scores[0, 10:14] = scores[0].max() + 1  # a four-way tie at the top
    scores[1, 20:30] = 0.5                  # a tie around the top-k threshold
    scores[2] = 0.0                         # all equal
    scores[3, 50] = -4.0                    # a negative seen token
    history = torch.randint(0, v, (b, 12), generator=gen)
    history[3, 0] = 50
    mask = torch.ones(b, 12, dtype=torch.long)
    mask[1, :4] = 0                         # left padding: not penalised
    pad_lengths = (mask != 0).int().argmax(dim=1)
    seen = torch.zeros(b, v, dtype=torch.bool)
    for r in range(b):
        seen[r, history[r, pad_lengths[r]:]] = True
    t = {"scores": scores, "seen": seen.to(torch.uint8)}
    t["rep_1.3"] = RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=pad_lengths)(history, scores.clone())
    t["rep_0.8"] = RepetitionPenaltyLogitsProcessor(0.8, prompt_ignore_length=pad_lengths)(history, scores.clone())
    t["temp_0.7"] = TemperatureLogitsWarper(0.7)(history, scores.clone())
    for k in (1, 5, 10, 25):
        t[f"topk_{k}"] = TopKLogitsWarper(k)(history, scores.clone())
    for p in (0.1, 0.5, 0.8, 0.95, 1.0):
        t[f"topp_{p}"] = TopPLogitsWarper(p)(history, scores.clone()) if p < 1 else scores.clone()
    chain = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2, prompt_ignore_length=pad_lengths),
                                 TemperatureLogitsWarper(0.8), TopKLogitsWarper(20), TopPLogitsWarper(0.9)])
    t["chain"] = chain(history, scores.clone())
    save_file({k: x.contiguous() for k, x in t.items()}, str(out_root / "processors.safetensors"))
    print(f"processors: {len(t) - 2} reference outputs")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train_bin", default=os.environ.get("ALPACA_TRAIN_BIN", str(REPO / "build" / "alpaca-train")))
    ap.add_argument("--smollm2", default=str(REPO / "models" / "smollm2-135m-instruct"))
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    processors(out)
    tiny(out, args.train_bin)
    smollm2(out, args.smollm2)


if __name__ == "__main__":
    main()
