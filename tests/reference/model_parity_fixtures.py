#!/usr/bin/env python3
"""Reference fixtures for the C++ LLaMA parity tests (tests/model/test_llama_parity.cpp).

For each tiny config in tests/fixtures/configs/tiny_*.json: build transformers' LlamaForCausalLM
(MistralForCausalLM, Qwen2ForCausalLM for those model types)
with a fixed seed, save it (safetensors, sharded safetensors, .bin, sharded .bin), run two
batches (one right-padded with labels masked like Alpaca, one unpadded) and write inputs, fp32
logits, loss and every parameter gradient, and the bf16 loss, to <out>/<config>/expected.safetensors.
"""
import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

CONFIG_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
CONFIGS = ["tiny_mha_untied", "tiny_gqa_tied", "tiny_llama3_rope", "tiny_linear_rope", "tiny_dynamic_rope",
           "tiny_mistral", "tiny_qwen2"]


def batches(vocab, gen):
    b, t = 2, 12
    ids = torch.randint(3, vocab, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 9:] = 0                      # right padding, as the Alpaca collator does
    ids[1, 9:] = 0
    labels = ids.clone()
    labels[:, :3] = -100                 # prompt tokens
    labels[mask == 0] = -100
    ids2 = torch.randint(3, vocab, (b, t), generator=gen)
    labels2 = ids2.clone()
    labels2[0, :5] = -100
    return {"pad": (ids, mask, labels), "nopad": (ids2, None, labels2)}


def run(model, ids, mask, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out.logits.detach().float(), out.loss.detach().float(), grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name in CONFIGS:
        cfg_dict = json.loads((CONFIG_DIR / f"{name}.json").read_text())
        cfg_dict.pop("torch_dtype", None)
        cfg = AutoConfig.for_model(**cfg_dict)  # model_type llama, mistral or qwen2
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(1234)
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        # Non-trivial norm weights and biases so they are really tested.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.add_(0.1 * torch.randn_like(p))
                if n.endswith(".bias"):
                    p.normal_(0.0, 0.02)
        d = out_root / name
        model.save_pretrained(d / "hf_safetensors")
        model.save_pretrained(d / "hf_sharded", max_shard_size="20KB")
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        if cfg.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        (d / "hf_bin").mkdir(parents=True, exist_ok=True)
        torch.save(sd, d / "hf_bin" / "pytorch_model.bin")
        (d / "hf_bin" / "config.json").write_text((d / "hf_safetensors" / "config.json").read_text())
        # Sharded .bin with its index, the layout of older Hub checkpoints.
        (d / "hf_bin_sharded").mkdir(parents=True, exist_ok=True)
        keys = list(sd)
        half = len(keys) // 2
        weight_map = {}
        for i, part in enumerate([keys[:half], keys[half:]]):
            fname = f"pytorch_model-{i + 1:05d}-of-00002.bin"
            torch.save({k: sd[k] for k in part}, d / "hf_bin_sharded" / fname)
            weight_map.update({k: fname for k in part})
        (d / "hf_bin_sharded" / "pytorch_model.bin.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
        (d / "hf_bin_sharded" / "config.json").write_text((d / "hf_safetensors" / "config.json").read_text())

        gen = torch.Generator().manual_seed(99)
        tensors = {}
        for tag, (ids, mask, labels) in batches(cfg.vocab_size, gen).items():
            logits, loss, grads = run(model, ids, mask, labels)
            tensors[f"{tag}.input_ids"] = ids
            if mask is not None:
                tensors[f"{tag}.attention_mask"] = mask
            tensors[f"{tag}.labels"] = labels
            tensors[f"{tag}.logits"] = logits
            tensors[f"{tag}.loss"] = loss.reshape(1)
            for n, g in grads.items():
                tensors[f"{tag}.grad.{n}"] = g
        bf = AutoModelForCausalLM.from_pretrained(d / "hf_safetensors", dtype=torch.bfloat16).eval()
        ids, mask, labels = batches(cfg.vocab_size, torch.Generator().manual_seed(99))["pad"]
        with torch.no_grad():
            tensors["pad.bf16_loss"] = bf(input_ids=ids, attention_mask=mask, labels=labels).loss.float().reshape(1)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "expected.safetensors"))
        print(f"{name}: pad loss {tensors['pad.loss'].item():.6f} bf16 {tensors['pad.bf16_loss'].item():.6f}")


if __name__ == "__main__":
    main()
