"""The tiny Alpaca reference both parity scripts train (train_parity_ref.py: full fine-tune,
lora_parity_ref.py: peft LoRA / QLoRA): the shared data, the tiny random LLaMA, train.py's
preprocessing and [PAD] row, and the Hugging Face Trainer step loop written out with
transformers' LlamaForCausalLM, torch.optim.AdamW and transformers.get_scheduler, on the same
example order as alpaca-train.

Semantics reproduced (and why they are the same as ours):
  - tokens: train.py's preprocess: BOS + sentencepiece(source + output) + EOS ("</s>" is split out
    as a special token by the slow LlamaTokenizer), right-truncated to model_max_length; labels
    -100 on the len(BOS + sentencepiece(source)) prompt positions.
  - [PAD] added (id 32000), embeddings resized with the new rows = mean of the old rows (input
    and output embeddings), as smart_tokenizer_and_embedding_resize.
  - order: epoch e is torch.randperm(N) with a generator seeded with data_seed + e; global batch
    k is positions [kG, (k+1)G); a final partial batch is filled from the start of the same order.
  - loss of a step: sum of token losses over the global batch / global label-token count.
  - clip_grad_norm_(max_grad_norm), AdamW(lr, betas, eps, weight_decay: none on biases/norms),
    LambdaLR from transformers.get_scheduler(type, warmup=ceil(ratio * steps), steps).
"""
import json
import math
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, get_scheduler  # noqa: E402

PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
                "### Input:\n{input}\n\n### Response:")
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:")
PAD_ID = 32000  # train.py's [PAD], appended to the LLaMA-2 vocabulary


def tokenize(records, sp, max_len):
    out = []
    for r in records:
        source = (PROMPT_INPUT if r.get("input", "") != "" else PROMPT_NO_INPUT).format_map(r)
        ids = ([sp.bos_id()] + sp.encode(source + r["output"]) + [sp.eos_id()])[:max_len]
        src_len = min(len([sp.bos_id()] + sp.encode(source)), max_len)
        labels = list(ids)
        labels[:src_len] = [-100] * src_len
        out.append((ids, labels))
    return out


def add_common_args(ap, steps, lr):
    """The flags both scripts take (defaults as alpaca-train's tests run them)."""
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default=os.environ.get("ALPACA_SHARED_DIR", str(Path(__file__).resolve().parents[3] / "shared")))
    ap.add_argument("--num_records", type=int, default=40)
    ap.add_argument("--max_len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--global_batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--warmup_ratio", type=float, default=0.1)
    ap.add_argument("--scheduler", default="cosine")
    ap.add_argument("--weight_decay", type=float, default=0.01)
    ap.add_argument("--max_grad_norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)


def shared_inputs(args):
    """(tokenizer.model, alpaca json) of the shared data, or None after writing SKIPPED to --out."""
    out = Path(args.out)
    shared = Path(args.shared) / "data"
    tok_path = shared / "llama2-tokenizer" / "tokenizer.model"
    alpaca = shared / "alpaca" / "alpaca_5000.json"
    if not tok_path.exists() or not alpaca.exists():
        out.mkdir(parents=True, exist_ok=True)
        (out / "SKIPPED").write_text(f"shared data not found under {shared}")
        print(f"shared data not found under {shared}; writing SKIPPED")
        return None
    return tok_path, alpaca


def parse_inputs(ap):
    """Parses the command line: (args, out, tokenizer.model, alpaca json), or None when the shared
    data is absent (SKIPPED written to --out)."""
    args = ap.parse_args()
    inputs = shared_inputs(args)
    return None if inputs is None else (args, Path(args.out), *inputs)


def save_tiny_model(model_dir, tok_path, hidden=32, intermediate=64):
    """The tiny random LLaMA (seed 0, fp32) saved as an HF dir with the LLaMA-2 tokenizer.model."""
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).float()
    model.save_pretrained(model_dir, safe_serialization=True)
    shutil.copy(tok_path, model_dir / "tokenizer.model")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True, "add_eos_token": False, "model_max_length": 4096, "legacy": True}))
    return model


def load_examples(out, alpaca, tok_path, args):
    """The first --num_records Alpaca records (also written to out/data.json), tokenized."""
    records = json.loads(alpaca.read_text())[: args.num_records]
    (out / "data.json").write_text(json.dumps(records))
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    return tokenize(records, sp, args.max_len)


def padded(seqs):
    """(input_ids, labels, attention_mask) of `seqs` right-padded to their longest, as the collator pads."""
    T = max(len(ids) for ids, _ in seqs)
    ids = torch.tensor([s[0] + [PAD_ID] * (T - len(s[0])) for s in seqs])
    labels = torch.tensor([s[1] + [-100] * (T - len(s[1])) for s in seqs])
    return ids, labels, ids.ne(PAD_ID)


def add_pad_row(model):
    """train.py: [PAD] -> id 32000; new rows = mean of the old rows, input and output embeddings."""
    with torch.no_grad():
        old_in = model.get_input_embeddings().weight.clone()
        old_out = model.get_output_embeddings().weight.clone()
        model.resize_token_embeddings(PAD_ID + 1, mean_resizing=False)
        model.get_input_embeddings().weight[-1] = old_in.mean(0)
        model.get_output_embeddings().weight[-1] = old_out.mean(0)


def train(model, named, examples, args, loss_fn=None, on_batch=None, make_optimizer=None):
    """HF Trainer's loop over `named` (the trainable (name, parameter) pairs): returns the losses,
    learning rates and gradient norms of --steps optimizer steps. `loss_fn(logits, labels, n_tokens)`
    replaces the cross-entropy (summed over the step's label tokens, divided by their count);
    `on_batch(model, seqs)` sees each step's (ids, labels) examples, in order, before its update;
    `make_optimizer(groups, model)` replaces torch's AdamW (same lr, betas, eps)."""
    no_decay = [n for n, _ in named if n.endswith("bias") or "norm" in n]
    groups = [{"params": [p for n, p in named if n not in no_decay], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0}]
    params = [p for _, p in named]
    opt = (torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, foreach=False)
           if make_optimizer is None else make_optimizer(groups, model))
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
        if on_batch is not None:
            on_batch(model, seqs)
        n_tokens = sum(sum(1 for t in lab[1:] if t != -100) for _, lab in seqs)
        ids, labels, mask = padded(seqs)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        if loss_fn is not None:
            loss = loss_fn(logits, labels, n_tokens)
        else:
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
    return losses, lrs, norms


def write_reference(out, losses, lrs, norms, args, **extra_config):
    """reference.json: the per-step numbers and the configuration that produced them."""
    config = {"steps": args.steps, "global_batch": args.global_batch, "lr": args.lr, "warmup_ratio": args.warmup_ratio,
              "scheduler": args.scheduler, "weight_decay": args.weight_decay, "max_len": args.max_len,
              "max_grad_norm": args.max_grad_norm, "seed": args.seed, **extra_config}
    (out / "reference.json").write_text(json.dumps(
        {"losses": losses, "learning_rates": lrs, "grad_norms": norms, "config": config}, indent=1))
    print("losses", [round(x, 4) for x in losses])
