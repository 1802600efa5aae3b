#!/usr/bin/env python3
"""Reference fixtures for the C++ LLaMA parity tests (tests/model/test_llama_parity.cpp).

For each tiny config in tests/fixtures/configs/tiny_*.json: build transformers' LlamaForCausalLM
(MistralForCausalLM, Qwen2ForCausalLM for those model types)
with a fixed seed, save it (safetensors, sharded safetensors, .bin, sharded .bin), run two
batches (one right-padded with labels masked like Alpaca, one unpadded) and write inputs, fp32
logits, loss and every parameter gradient, and the bf16 loss, to <out>/<config>/expected.safetensors.

The LLaMA variants each as their checkpoints ship (LLaMA-1: no num_key_value_heads, max_sequence_length,
pad_token_id -1; LLaMA-2 GQA; LLaMA-3: rope_theta 500000, one KV head; LLaMA-3.1: llama3 rope_scaling;
LLaMA-3.2: tied embeddings, explicit head_dim; YaRN and LongRoPE scaling, the longrope ones at 12 positions past
and within the pretraining context: the long and the short factors; sliding windows of 5 (Mistral, every
layer) and 4 (Qwen2, layer 1 only) that the 12-position batches cross) in both config forms: hf_safetensors/config.json is
transformers 5's (rope_parameters, as save_pretrained writes it), hf_legacy/config.json the file
verbatim (rope_theta, rope_scaling). transformers must read both to the same model (checked here);
what it read (transformers_config.json, and the RoPE inv_freq / attention scaling in
expected.safetensors) is what the C++ parser must read.
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
           "tiny_mistral", "tiny_qwen2", "tiny_llama1", "tiny_llama2_gqa", "tiny_llama3", "tiny_llama32",
           "tiny_yarn_rope", "tiny_qwen2_yarn", "tiny_longrope", "tiny_longrope_short", "tiny_mistral_sliding",
           "tiny_qwen2_sliding"]
# What transformers read from config.json, for the C++ parser to match (None: not a field of that type).
READ_FIELDS = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
               "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id",
               "sliding_window", "layer_types"]


def read_config(model):
    c = model.config
    out = {k: getattr(c, k, None) for k in READ_FIELDS}
    out["rope_parameters"] = dict(c.rope_parameters or {})
    return out


def legacy_form(d, cfg_text, model):
    """hf_legacy: the same weights with the config.json text as the checkpoint shipped it."""
    leg = d / "hf_legacy"
    leg.mkdir(parents=True, exist_ok=True)
    for f in (d / "hf_safetensors").iterdir():
        if f.name != "config.json":
            (leg / f.name).write_bytes(f.read_bytes())
    (leg / "config.json").write_text(cfg_text)
    # transformers reads both forms to the same model: same config fields, RoPE and logits.
    ids = torch.arange(3, 15).reshape(1, 12) % model.config.vocab_size
    read = {}
    for form in ("hf_safetensors", "hf_legacy"):
        m = AutoModelForCausalLM.from_pretrained(d / form, dtype=torch.float32).eval()
        with torch.no_grad():
            assert torch.equal(m(input_ids=ids).logits, model(input_ids=ids).logits), f"{d.name}/{form}: logits"
        assert torch.equal(m.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq), f"{d.name}/{form}: inv_freq"
        read[form] = read_config(m)
    assert read["hf_safetensors"] == read["hf_legacy"], (read["hf_safetensors"], read["hf_legacy"])
    (d / "transformers_config.json").write_text(json.dumps(read["hf_legacy"], indent=1))


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
        cfg_text = (CONFIG_DIR / f"{name}.json").read_text()
        cfg_dict = json.loads(cfg_text)
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
        inv_freq = model.model.rotary_emb.inv_freq.float().clone()  # as initialised (dynamic RoPE grows it in use)
        legacy_form(d, cfg_text, model)
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
        tensors = {"rope.inv_freq": inv_freq,
                   "rope.attention_scaling": torch.tensor([float(model.model.rotary_emb.attention_scaling)],
                                                       dtype=torch.float64)}
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
        # Greedy decoding through the KV cache: 5 prompt tokens, 10 new ones, so the positions pass a
        # dynamic or longrope config's context mid-generation (each step's RoPE is chosen from that
        # step's positions; the cache keeps what earlier steps wrote). The smallest top-1/top-2 margin
        # says how close a tie came.
        gm = AutoModelForCausalLM.from_pretrained(d / "hf_safetensors", dtype=torch.float32).eval()
        gm.generation_config.eos_token_id = None
        prompt = torch.arange(5, 10).reshape(1, 5) % cfg.vocab_size
        with torch.no_grad():
            out = gm.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0, output_scores=True,
                              return_dict_in_generate=True)
        margin = min(float((lambda t: t[0, 0] - t[0, 1])(s.float().topk(2).values)) for s in out.scores)
        tensors["generate.prompt"] = prompt
        tensors["generate.ids"] = out.sequences[:, 5:]
        tensors["generate.margin"] = torch.tensor([margin], dtype=torch.float64)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "expected.safetensors"))
        print(f"{name}: pad loss {tensors['pad.loss'].item():.6f} bf16 {tensors['pad.bf16_loss'].item():.6f}")


if __name__ == "__main__":
    main()
