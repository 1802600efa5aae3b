"""Pre-quantized bitsandbytes 4-bit checkpoints (`*-bnb-4bit` directories) for
tests/fsdp/test_fsdp_qlora.cpp and tests/train/test_qlora_parity.cpp: a tiny random LLaMA saved in
fp32 (model/), then loaded through transformers' BitsAndBytesConfig(load_in_4bit=True) on the CPU
(bitsandbytes' Linear4bit quantizes every linear but lm_head) and written back with
model.save_pretrained: packed uint8 weights of shape [n/2, 1] with `.absmax`, `.quant_map`,
`.nested_absmax`, `.nested_quant_map` and `.quant_state.bitsandbytes__<type>`, quantization_config
in config.json. Two of them: nf4 with nested quantization (model-nf4-nested-bnb-4bit/) and fp4
without (model-fp4-bnb-4bit/); and two broken copies of the nf4 one: layer 1's down_proj
quant_state names the transposed shape (model-bad-quant-state/), layer 0's k_proj names quant_type
int4 (model-bad-quant-type/). data.json: 16 real Alpaca records.
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alpaca_reference import parse_inputs  # noqa: E402

BAD_TENSOR = "model.layers.1.mlp.down_proj.weight"
BAD_TYPE_TENSOR = "model.layers.0.self_attn.k_proj.weight"


def copy_tokenizer(tok_path, d):
    shutil.copy(tok_path, d / "tokenizer.model")
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True, "add_eos_token": False, "model_max_length": 4096, "legacy": True}))


def save_quantized(model_dir, out_dir, quant_type, nested, tok_path):
    qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=nested,
                              bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=qcfg, dtype=torch.float32,
                                                 device_map="cpu")
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_tokenizer(tok_path, out_dir)
    cfg = json.loads((out_dir / "config.json").read_text())
    assert cfg["quantization_config"]["load_in_4bit"], cfg
    return out_dir


def break_quant_state(good_dir, bad_dir, tensor, field, value):
    """`tensor`'s quant_state gets field = value(old value): it disagrees with the model or bitsandbytes."""
    shutil.copytree(good_dir, bad_dir)
    path = bad_dir / "model.safetensors"
    tensors = load_file(path)
    key = next(k for k in tensors if k.startswith(tensor + ".quant_state."))
    state = json.loads(bytes(tensors[key].tolist()).decode("utf-8"))
    state[field] = value(state[field])
    tensors[key] = torch.tensor(list(json.dumps(state).encode("utf-8")), dtype=torch.uint8)
    save_file(tensors, path, metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default=os.environ.get("ALPACA_SHARED_DIR", str(Path(__file__).resolve().parents[3] / "shared")))
    parsed = parse_inputs(ap)
    if parsed is None:
        return
    args, out, tok_path, alpaca = parsed
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=100, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model_dir = out / "model"
    LlamaForCausalLM(cfg).float().save_pretrained(model_dir, safe_serialization=True)
    copy_tokenizer(tok_path, model_dir)
    nf4 = save_quantized(model_dir, out / "model-nf4-nested-bnb-4bit", "nf4", True, tok_path)
    save_quantized(model_dir, out / "model-fp4-bnb-4bit", "fp4", False, tok_path)
    break_quant_state(nf4, out / "model-bad-quant-state", BAD_TENSOR, "shape", lambda v: list(reversed(v)))
    break_quant_state(nf4, out / "model-bad-quant-type", BAD_TYPE_TENSOR, "quant_type", lambda v: "int4")
    (out / "data.json").write_text(json.dumps(json.loads(alpaca.read_text())[:16]))
    print(f"wrote {out}: {sorted(p.name for p in out.iterdir())}")


if __name__ == "__main__":
    main()
