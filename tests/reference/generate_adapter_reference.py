#!/usr/bin/env python3
"""Reference fixtures for generation with an unmerged LoRA adapter (tests/generate/test_generate_adapter.cpp).

A tiny random LLaMA from `alpaca-train init-model` (GQA, two EOS ids) gets a peft LoRA adapter made
by peft itself (get_peft_model + save_pretrained, so the key layout is peft's): r 4, alpha 8 on
q_proj, v_proj, o_proj and down_proj, lm_head in modules_to_save, trainable tokens on rows 5, 7
and 9 of embed_tokens. A and B are random (B is zero at init, which would test nothing), the
saved lm_head and the token rows are perturbed. Then the adapter is loaded back the way a user
would (PeftModel.from_pretrained) and generate(do_sample=False) runs in fp32 on 6 prompts x 16
new tokens as one left-padded batch and one prompt at a time, and on 3 text prompts (the bundled SentencePiece tokenizer, for the
command line) as one batch. Also written: the same adapter with
one LoRA module renamed (missing in the base) and one with a wrong-shaped B (another base), and a
plain LoRA adapter on all seven linears (no modules_to_save, no token rows) with its one-by-one
answers.
<out>/adapter.json: prompts, new ids, min top-2 margin, with and without the adapter (the
adapter must change the answers, or the test could not fail).

  .venv/bin/python tests/reference/generate_adapter_reference.py --out build/fixtures/generate_adapter
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]
NUM_PROMPTS, NEW_TOKENS = 6, 16
sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_reference import TINY_CONFIG as GENERATE_CONFIG, greedy as reference_greedy  # noqa: E402
TINY_CONFIG = {**GENERATE_CONFIG, "vocab_size": 512}  # the bundled tokenizer's 512 pieces
TOKEN_ROWS = [5, 7, 9]
TEXTS = ["Say hi", "Give three tips for staying healthy.", "What is 2 + 3?"]


def greedy(model, prompts, eos, pad, batched):
    return reference_greedy(model, prompts, eos, pad, batched, NEW_TOKENS)


def randomized(pm, seed):
    """Random LoRA A and B (B is zero at init, which would test nothing), perturbed saved modules and token rows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            elif "modules_to_save" in name or "trainable_tokens_delta" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return pm


def load_base(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train_bin", default=os.environ.get("ALPACA_TRAIN_BIN", str(REPO / "build" / "alpaca-train")))
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(TINY_CONFIG))
    model_dir, adapter_dir = out / "model", out / "adapter"
    subprocess.run([args.train_bin, "init-model", "--config", str(out / "config.json"), "--output_dir", str(model_dir),
                    "--seed", "3"], check=True)
    for f in (REPO / "data" / "tokenizer").iterdir():  # the bundled SentencePiece tokenizer (512 pieces)
        shutil.copy(f, model_dir / f.name)

    # The adapter, made and saved by peft (its key layout), with non-zero values.
    torch.manual_seed(0)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                     modules_to_save=["lm_head"], trainable_token_indices={"embed_tokens": TOKEN_ROWS},
                     task_type="CAUSAL_LM")
    pm = randomized(get_peft_model(load_base(model_dir), cfg), seed=7)
    if adapter_dir.exists():
        shutil.rmtree(adapter_dir)
    pm.save_pretrained(str(adapter_dir))
    saved = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert saved["trainable_token_indices"] == {"embed_tokens": TOKEN_ROWS}, saved["trainable_token_indices"]

    gen = torch.Generator().manual_seed(5)
    prompts = []
    for _ in range(NUM_PROMPTS):
        n = int(torch.randint(3, 20, (1,), generator=gen))
        prompts.append([1] + torch.randint(4, TINY_CONFIG["vocab_size"], (n - 1,), generator=gen).tolist())
    eos, pad = TINY_CONFIG["eos_token_id"], TINY_CONFIG["pad_token_id"]

    peft_model = PeftModel.from_pretrained(load_base(model_dir), str(adapter_dir)).eval()
    batched, m_b = greedy(peft_model, prompts, eos, pad, batched=True)
    # Text prompts for the command line (--raw_prompt), tokenized by transformers.
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text_ids = [tok(t)["input_ids"] for t in TEXTS]
    text_batched, m_t = greedy(peft_model, text_ids, eos, pad, batched=True)
    single, m_s = greedy(peft_model, prompts, eos, pad, batched=False)
    base_batched, _ = greedy(load_base(model_dir), prompts, eos, pad, batched=True)
    differ = sum(1 for a, b in zip(batched, base_batched) if a != b)
    assert differ > 0, "the adapter changes no answer; the test would not test it"

    # A plain LoRA adapter (every linear, nothing else: the common --use_peft output), one by one.
    torch.manual_seed(1)
    cfg2 = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm2 = randomized(get_peft_model(load_base(model_dir), cfg2), seed=8)
    lora_only_dir = out / "lora_only"
    if lora_only_dir.exists():
        shutil.rmtree(lora_only_dir)
    pm2.save_pretrained(str(lora_only_dir))
    peft_model2 = PeftModel.from_pretrained(load_base(model_dir), str(lora_only_dir)).eval()
    lora_only_single, m_l = greedy(peft_model2, prompts, eos, pad, batched=False)
    assert lora_only_single != base_batched, "the plain adapter changes no answer"

    # Adapters that do not fit the base: a module the base lacks, and a B of another shape.
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    for name, edit in (("missing_module", "rename"), ("wrong_shape", "reshape")):
        d = out / name
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(adapter_dir, d)
        t = dict(tensors)
        if edit == "rename":
            for suffix in ("lora_A.weight", "lora_B.weight"):
                t[f"base_model.model.model.layers.1.self_attn.qq_proj.{suffix}"] = t.pop(
                    f"base_model.model.model.layers.1.self_attn.q_proj.{suffix}")
        else:
            k = "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"
            t[k] = torch.zeros(t[k].shape[0] * 2, t[k].shape[1])
        save_file(t, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})

    rec = {"model_dir": str(model_dir), "adapter_dir": str(adapter_dir), "max_new_tokens": NEW_TOKENS,
           "eos_token_id": eos, "pad_token_id": pad, "prompts": prompts, "batched": batched, "single": single,
           "base_batched": base_batched, "min_margin": min(m_b, m_s),
           "texts": TEXTS, "text_ids": text_ids, "text_batched": text_batched, "text_min_margin": m_t,
           "lora_only_single": lora_only_single, "lora_only_min_margin": m_l}
    (out / "adapter.json").write_text(json.dumps(rec))
    print(f"adapter: {len(prompts)} prompts, adapter changes {differ} answers, batched == single for "
          f"{sum(a == b for a, b in zip(batched, single))}, min top-2 margin {min(m_b, m_s):.4g} "
          f"(text prompts {m_t:.4g})")


if __name__ == "__main__":
    main()
