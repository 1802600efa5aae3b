"""Reference LoRA trainer for tests/train/test_lora_parity: transformers' LlamaForCausalLM + peft
(LoraConfig, get_peft_model) + torch.optim.AdamW + transformers.get_scheduler, on the same tiny
random LLaMA, real Alpaca records and example order as alpaca-train (train_parity_ref.py's
semantics), starting from alpaca-train's initial adapter: A is drawn exactly as model::apply_lora
draws it (kaiming_uniform_(a=sqrt(5)) from one torch.Generator seeded with --seed, in module
order), B = 0; the test also checks our A against lora_init.safetensors bitwise. train.py's added
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

With --load_in_4bit (QLoRA, tests/train/test_qlora_parity.cpp) the saved fp32 model is loaded back
through transformers' BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant,
compute dtype fp32): bitsandbytes' Linear4bit on the CPU, the real HF stack; --hidden 64
--intermediate 128 keep every linear's input width a multiple of the 64-value block, where
bitsandbytes' AVX-512 dequantizer indexes its scales correctly (see quant4_reference.py).
"""
import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, get_scheduler  # noqa: E402

from train_parity_ref import tokenize  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default=os.environ.get("ALPACA_SHARED_DIR", str(Path(__file__).resolve().parents[3] / "shared")))
    ap.add_argument("--num_records", type=int, default=40)
    ap.add_argument("--max_len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--global_batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-2)
    ap.add_argument("--warmup_ratio", type=float, default=0.1)
    ap.add_argument("--scheduler", default="cosine")
    ap.add_argument("--weight_decay", type=float, default=0.01)
    ap.add_argument("--max_grad_norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lora_r", type=int, default=8)
    ap.add_argument("--lora_alpha", type=float, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=64)
    ap.add_argument("--load_in_4bit", action="store_true")
    ap.add_argument("--bnb_4bit_quant_type", default="nf4")
    ap.add_argument("--use_bnb_nested_quant", action="store_true")
    args = ap.parse_args()

    out = Path(args.out)
    shared = Path(args.shared) / "data"
    tok_path = shared / "llama2-tokenizer" / "tokenizer.model"
    alpaca = shared / "alpaca" / "alpaca_5000.json"
    if not tok_path.exists() or not alpaca.exists():
        out.mkdir(parents=True, exist_ok=True)
        (out / "SKIPPED").write_text(f"shared data not found under {shared}")
        print(f"shared data not found under {shared}; writing SKIPPED")
        return
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model_dir = out / "model"
    cfg = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).float()
    model.save_pretrained(model_dir, safe_serialization=True)
    shutil.copy(tok_path, model_dir / "tokenizer.model")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True, "add_eos_token": False, "model_max_length": 4096, "legacy": True}))
    if args.load_in_4bit:
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=args.bnb_4bit_quant_type,
                                  bnb_4bit_use_double_quant=args.use_bnb_nested_quant,
                                  bnb_4bit_compute_dtype=torch.float32)
        model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=qcfg, dtype=torch.float32,
                                                     device_map="cpu", attn_implementation="eager")
        assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"

    records = json.loads(alpaca.read_text())[: args.num_records]
    (out / "data.json").write_text(json.dumps(records))
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    examples = tokenize(records, sp, args.max_len)

    # train.py: [PAD] -> id 32000; new rows = mean of the old rows, input and output embeddings.
    pad_id = 32000
    with torch.no_grad():
        old_in = model.get_input_embeddings().weight.clone()
        old_out = model.get_output_embeddings().weight.clone()
        model.resize_token_embeddings(32001, mean_resizing=False)
        model.get_input_embeddings().weight[-1] = old_in.mean(0)
        model.get_output_embeddings().weight[-1] = old_out.mean(0)

    # target_modules=None: peft's default for LLaMA (q_proj, v_proj), which alpaca-train also uses.
    # The added [PAD] rows train as peft trainable tokens (TrainableTokensLayer on both tables:
    # the model is untied), as alpaca-train trains them.
    lcfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0, target_modules=None,
                      task_type="CAUSAL_LM", trainable_token_indices={"embed_tokens": [pad_id], "lm_head": [pad_id]})
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

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    deltas = {n.removeprefix("base_model.model.").removesuffix(".default"): p for n, p in named
              if "trainable_tokens_delta" in n}
    assert len(deltas) == 2, sorted(deltas)
    tokens = {n + ".init": p.detach().clone() for n, p in deltas.items()}
    no_decay = [n for n, _ in named if n.endswith("bias") or "norm" in n]
    groups = [{"params": [p for n, p in named if n not in no_decay], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0}]
    params = [p for _, p in named]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    warmup = math.ceil(args.steps * args.warmup_ratio)
    sched = get_scheduler(args.scheduler, opt, num_warmup_steps=warmup, num_training_steps=args.steps)

    n, G = len(examples), args.global_batch
    steps_per_epoch = math.ceil(n / G)
    losses, lrs, norms = [], [], []
    for step in range(args.steps):
        epoch, k = divmod(step, steps_per_epoch)
        gen = torch.Generator()
        gen.manual_seed(args.seed + epoch)
        order = torch.randperm(n, generator=gen).tolist()
        batch = [order[(k * G + j) % n] if k * G + j < n else order[(k * G + j) - n] for j in range(G)]
        seqs = [examples[i] for i in batch]
        n_tokens = sum(sum(1 for t in lab[1:] if t != -100) for _, lab in seqs)
        T = max(len(ids) for ids, _ in seqs)
        ids = torch.tensor([s[0] + [pad_id] * (T - len(s[0])) for s in seqs])
        labels = torch.tensor([s[1] + [-100] * (T - len(s[1])) for s in seqs])
        logits = model(input_ids=ids, attention_mask=ids.ne(pad_id)).logits.float()
        loss_sum = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                     labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
        loss = loss_sum / max(n_tokens, 1)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(norm.item())
    tokens.update({n: p.detach().clone() for n, p in deltas.items()})
    # Every LoRA matrix after the last step, under the names peft saves (adapter_model.safetensors):
    # each one integrates that matrix's gradients over every step.
    save_file({n.replace(".default", ""): p.detach().clone().contiguous() for n, p in named if ".lora_" in n},
              str(out / "lora_final.safetensors"))
    save_file(tokens, str(out / "tokens_final.safetensors"))
    (out / "reference.json").write_text(json.dumps(
        {"losses": losses, "learning_rates": lrs, "grad_norms": norms,
         "config": {"steps": args.steps, "global_batch": G, "lr": args.lr, "warmup_ratio": args.warmup_ratio,
                    "scheduler": args.scheduler, "weight_decay": args.weight_decay, "max_len": args.max_len,
                    "max_grad_norm": args.max_grad_norm, "seed": args.seed, "lora_r": args.lora_r,
                    "lora_alpha": args.lora_alpha, "load_in_4bit": args.load_in_4bit,
                    "bnb_4bit_quant_type": args.bnb_4bit_quant_type, "use_bnb_nested_quant": args.use_bnb_nested_quant,
                    "trainable": [n for n, _ in named]}}, indent=1))
    print("losses", [round(x, 4) for x in losses])


if __name__ == "__main__":
    main()
