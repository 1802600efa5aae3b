"""Reference LoRA trainer for tests/train/test_lora_parity: transformers' LlamaForCausalLM + peft
(LoraConfig, get_peft_model) + torch.optim.AdamW + transformers.get_scheduler, on the same tiny
random LLaMA, real Alpaca records and example order as alpaca-train (train_parity_ref.py's
semantics), starting from alpaca-train's initial adapter: A is drawn exactly as model::apply_lora
draws it (kaiming_uniform_(a=sqrt(5)) from one torch.Generator seeded with --seed, in module
order), B = 0 (the model, data and step loop: alpaca_reference.py); the test also checks our A against lora_init.safetensors bitwise. train.py's added
[PAD] rows (mean-initialised) train as peft trainable tokens (trainable_token_indices on
embed_tokens and lm_head), as alpaca-train trains them.

Writes into --out:
  model/                 the tiny random LLaMA (HF dir, fp32 safetensors, LLaMA-2 tokenizer.model)
  data.json              the Alpaca records both sides train on
  lora_init.safetensors  the initial A of every adapted module, under our parameter names
  tokens_final.safetensors  the [PAD] trainable-token rows after the last step (and "<name>.init"
                         before the first), under our parameter names
  lora_final.safetensors every LoRA matrix after the last step, under peft's saved names
  reference.json         {"losses": [...], "learning_rates": [...], "grad_norms": [...], "config": {...}}
  regex_targets.json     (plain runs) for each of REGEX_TARGETS, the linears peft adapts when
                         target_modules is that string, or peft's error

With --use_dora (tests/train/test_lora_parity.cpp's DoRA tests) peft's LoraConfig(use_dora=True): each
adapted linear also trains its lora_magnitude_vector, initialised by peft from the base weight's row norms,
and lora_final.safetensors holds those too.

With --load_in_4bit (QLoRA, tests/train/test_qlora_parity.cpp) the saved fp32 model is loaded back
through transformers' BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant,
compute dtype fp32): bitsandbytes' Linear4bit on the CPU, the real HF stack; --hidden 64
--intermediate 128 keep every linear's input width a multiple of the 64-value block, where
bitsandbytes' AVX-512 dequantizer indexes its scales correctly (see quant4_reference.py).
"""

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import alpaca_reference as ref  # noqa: E402


def load_4bit(model_dir, args):
    """The saved fp32 model loaded back through bitsandbytes' Linear4bit (QLoRA)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=args.bnb_4bit_quant_type,
                              bnb_4bit_use_double_quant=args.use_bnb_nested_quant,
                              bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=qcfg, dtype=torch.float32,
                                                 device_map="cpu", attn_implementation="eager")
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    return model


def attach_lora(model, args, out):
    """peft's LoRA with alpaca-train's initial A (written to lora_init.safetensors), B = 0."""
    # target_modules=None: peft's default for LLaMA (q_proj, v_proj), which alpaca-train also uses.
    # The added [PAD] rows train as peft trainable tokens (TrainableTokensLayer on both tables:
    # the model is untied), as alpaca-train trains them.
    lcfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0, target_modules=None,
                      task_type="CAUSAL_LM", use_dora=args.use_dora,
                      trainable_token_indices={"embed_tokens": [ref.PAD_ID], "lm_head": [ref.PAD_ID]})
    model = get_peft_model(model, lcfg)
    init = {}
    g = torch.Generator()
    g.manual_seed(args.seed)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
                a = mod.lora_A["default"].weight
                torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=g)
                mod.lora_B["default"].weight.zero_()
                ours = name.removeprefix("base_model.model.") + ".lora_A.weight"
                init[ours] = a.detach().clone().contiguous()
    save_file(init, str(out / "lora_init.safetensors"))
    return model


# peft's target_modules as a string: one regular expression, re.fullmatch'ed against module names.
REGEX_TARGETS = [r".*\.layers\.0\..*_proj", r".*(q|v)_proj", r"model\.layers\.[0-9]{1,2}\.mlp\.(up|down)_proj",
                 r"model\.layers\.1\.self_attn\.[kvo]_proj", r"lm_head|.*\.1\.mlp\.gate_proj", r".*self_attn",
                 r"nothing_here.*"]


def regex_targets(model_dir, out):
    """Which linears peft adapts for each of REGEX_TARGETS (or its error), as regex_targets.json."""
    from transformers import LlamaForCausalLM
    res = {}
    for pattern in REGEX_TARGETS:
        base = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        try:
            m = get_peft_model(base, LoraConfig(r=2, target_modules=pattern, task_type="CAUSAL_LM"))
            names = [n.removeprefix("base_model.model.") for n, mod in m.named_modules()
                     if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {})]
            res[pattern] = {"modules": names}
        except ValueError as e:
            res[pattern] = {"error": str(e)[:200]}
    (out / "regex_targets.json").write_text(json.dumps(res, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ref.add_common_args(ap, steps=20, lr=2e-2)
    ap.add_argument("--lora_r", type=int, default=8)
    ap.add_argument("--lora_alpha", type=float, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=64)
    ap.add_argument("--load_in_4bit", action="store_true")
    ap.add_argument("--bnb_4bit_quant_type", default="nf4")
    ap.add_argument("--use_bnb_nested_quant", action="store_true")
    ap.add_argument("--use_dora", action="store_true")
    parsed = ref.parse_inputs(ap)
    if parsed is None:
        return
    args, out, tok_path, alpaca = parsed
    model_dir = out / "model"
    model = ref.save_tiny_model(model_dir, tok_path, args.hidden, args.intermediate)
    if not args.load_in_4bit and not args.use_dora:
        regex_targets(model_dir, out)
    if args.load_in_4bit:
        model = load_4bit(model_dir, args)
    examples = ref.load_examples(out, alpaca, tok_path, args)
    ref.add_pad_row(model)
    model = attach_lora(model, args, out)

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    deltas = {n.removeprefix("base_model.model.").removesuffix(".default"): p for n, p in named
              if "trainable_tokens_delta" in n}
    assert len(deltas) == 2, sorted(deltas)
    tokens = {n + ".init": p.detach().clone() for n, p in deltas.items()}
    losses, lrs, norms = ref.train(model, named, examples, args)
    tokens.update({n: p.detach().clone() for n, p in deltas.items()})
    # Every LoRA matrix after the last step, under the names peft saves (adapter_model.safetensors):
    # each one integrates that matrix's gradients over every step.
    save_file({n.replace(".default", ""): p.detach().clone().contiguous() for n, p in named if ".lora_" in n},
              str(out / "lora_final.safetensors"))
    save_file(tokens, str(out / "tokens_final.safetensors"))
    ref.write_reference(out, losses, lrs, norms, args, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                        load_in_4bit=args.load_in_4bit, bnb_4bit_quant_type=args.bnb_4bit_quant_type,
                        use_bnb_nested_quant=args.use_bnb_nested_quant, use_dora=args.use_dora,
                        trainable=[n for n, _ in named])


if __name__ == "__main__":
    main()
