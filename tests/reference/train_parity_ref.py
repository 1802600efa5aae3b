"""Reference trainer for tests/train/test_train_parity: the math of Hugging Face Trainer on
Stanford Alpaca's recipe, written out with transformers' LlamaForCausalLM, torch.optim.AdamW and
transformers.get_scheduler, on the same tiny model, data and example order as alpaca-train.

Writes into --out:
  model/           the tiny random LLaMA (HF dir, fp32 safetensors, LLaMA-2 tokenizer.model)
  data.json        the Alpaca records both sides train on
  reference.json   {"losses": [...], "learning_rates": [...], "grad_norms": [...], "config": {...}}
  reference_label_smoothing.json, reference_dft.json, reference_adamw_8bit.json, reference_paged_adamw_32bit.json,
  reference_lion_8bit.json, reference_lion_32bit.json, reference_adafactor.json
                   10 steps from the same model with transformers' LabelSmoother (epsilon 0.1, normalised
                   by the step's label tokens: num_items_in_batch, as Trainer passes it), with TRL's
                   DFT loss (sft_trainer.py compute_loss: -log p * p.detach(), over the same count), and
                   with bitsandbytes' AdamW (8-bit moments; 32-bit), its Lion (8-bit; 32-bit) and transformers'
                   Adafactor as Trainer builds them
  reference_token_metrics.json
                   TRL SFTTrainer's entropy / mean_token_accuracy inputs for the first --metric_steps steps of
                   the plain run (its losses repeated as a check): per step, TRL's own fused LM head
                   (trl.trainer.utils.add_fused_lm_head, outputs entropy and is_top1) summed over the label
                   tokens of the global batch and of its two halves (the micro-batches of accumulation 2),
                   with their label and attention-mask token counts; and an evaluation of the initial
                   model over data.json in batches of --eval_batch (each batch's means, TRL's eval metrics),
                   and "eval_sharded": HF's eval_loss and TRL's eval metrics of the same model on 2 and 3
                   ranks and with group_by_length (accelerate's even_batches filling, gather_for_metrics)

The model, data, preprocessing and the step loop (and why their semantics are ours) are
alpaca_reference.py's, shared with lora_parity_ref.py.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alpaca_reference as ref  # noqa: E402
import torch  # noqa: E402
from alpaca_reference import tokenize  # noqa: E402,F401  (train_e2e_check.py imports it from here)


def fused_stats(model, seqs):
    """TRL's fused LM head over `seqs`: [entropy sum, top-1 count, label tokens, attention-mask tokens]."""
    ids, labels, mask = ref.padded(seqs)
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return [o.entropy.double().sum().item(), int(o.is_top1.sum().item()), int(o.label_mask.sum().item()),
            int(mask.sum().item())]


# Evaluations of the initial model as HF Trainer + TRL run them on several ranks or with length
# grouping: (world, per_device_eval_batch_size, group_by_length).
EVAL_SHARDED = [(2, 3, False), (3, 4, False), (1, 3, True), (2, 3, True)]


def eval_sharded(model, examples, seed=42):
    """HF's evaluation_loop + TRL's eval metrics over `examples` for each EVAL_SHARDED case, using
    the real batch composition: transformers' eval sampler (SequentialSampler, or LengthGroupedSampler
    with a generator seeded `seed` under group_by_length) in batches, dealt to the ranks by
    accelerate's BatchSamplerShard (even_batches, as Accelerator.prepare builds it); each rank's
    batch loss repeated per row and gathered rank-major, the last round truncated to
    len % (batch x world) by gather_for_metrics, which also keeps only that many ranks' scalars of the
    last round (TRL's entropy / top-1 / label sums)."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler
    from transformers.trainer_pt_utils import LengthGroupedSampler

    n = len(examples)
    lengths = [len(ids) for ids, _ in examples]
    results = []
    for world, b, group in EVAL_SHARDED:
        per_rank = []
        for k in range(world):  # each process builds its own sampler and generator
            sampler = (LengthGroupedSampler(b, lengths=lengths, generator=torch.Generator().manual_seed(seed))
                       if group else SequentialSampler(range(n)))
            batches = BatchSampler(sampler, b, drop_last=False)
            if world > 1:
                batches = BatchSamplerShard(batches, num_processes=world, process_index=k, split_batches=False,
                                            even_batches=True)
            per_rank.append(list(batches))
        rounds = len(per_rank[0])
        assert all(len(r) == rounds for r in per_rank)
        remainder = n % (b * world)
        losses, entropies, accuracies = [], [], []
        for r in range(rounds):
            gathered, scalars = [], []
            for k in range(world):
                seqs = [examples[i] for i in per_rank[k][r]]
                ids, labels, mask = ref.padded(seqs)
                with torch.no_grad():
                    o = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
                    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
                gathered += [loss] * len(seqs)
                scalars.append((o.entropy.double().sum().item(), int(o.is_top1.sum().item()),
                                int(o.label_mask.sum().item())))
            if r == rounds - 1 and remainder > 0 and world > 1:
                gathered, scalars = gathered[:remainder], scalars[:remainder]
            losses += gathered
            ent, top1, valid = (sum(x[j] for x in scalars) for j in range(3))
            entropies.append(ent / valid if valid > 0 else 0.0)
            accuracies.append(top1 / valid if valid > 0 else 0.0)
        # A batch without label tokens has a NaN mean loss, which makes HF's eval_loss NaN; alpaca-train
        # leaves such batches out (documented), so the reference does too.
        kept = [x for x in losses if x == x]
        results.append({"world": world, "batch": b, "group_by_length": group,
                        "batches_rank0": [list(map(int, x)) for x in per_rank[0]],
                        "eval_loss": sum(kept) / len(kept), "eval_entropy": sum(entropies) / rounds,
                        "eval_mean_token_accuracy": sum(accuracies) / rounds})
        print("eval sharded", results[-1]["world"], b, group, round(results[-1]["eval_loss"], 6))
    return results


def token_metrics(out, examples, args):
    from transformers import LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    def fresh():
        m = LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32, attn_implementation="eager")
        ref.add_pad_row(m)
        add_fused_lm_head(m, outputs=("log_probs", "entropy", "is_top1"))  # TRL SFTTrainer's outputs
        return m

    m = fresh()
    b = args.eval_batch
    evals = [fused_stats(m, examples[i:i + b]) for i in range(0, len(examples), b)]
    sharded = eval_sharded(m, examples)
    steps = []

    def on_batch(model, seqs):
        h = len(seqs) // 2
        steps.append({"batch": fused_stats(model, seqs), "halves": [fused_stats(model, seqs[:h]),
                                                                     fused_stats(model, seqs[h:])]})

    metric_args = argparse.Namespace(**{**vars(args), "steps": args.metric_steps})
    losses, _, _ = ref.train(m, list(m.named_parameters()), examples, metric_args, on_batch=on_batch)
    (out / "reference_token_metrics.json").write_text(json.dumps(
        {"steps": steps, "losses": losses, "eval_batch": b, "eval": evals, "eval_sharded": sharded}, indent=1))
    acc = [s["batch"][1] / s["batch"][2] for s in steps]
    print("token metrics: accuracy", [round(a, 4) for a in acc], "entropy",
          [round(s["batch"][0] / s["batch"][2], 4) for s in steps])


def main():
    ap = argparse.ArgumentParser()
    ref.add_common_args(ap, steps=30, lr=1e-3)
    ap.add_argument("--metric_steps", type=int, default=30)
    ap.add_argument("--eval_batch", type=int, default=16)
    parsed = ref.parse_inputs(ap)
    if parsed is None:
        return
    args, out, tok_path, alpaca = parsed
    model = ref.save_tiny_model(out / "model", tok_path)
    examples = ref.load_examples(out, alpaca, tok_path, args)
    ref.add_pad_row(model)
    losses, lrs, norms = ref.train(model, list(model.named_parameters()), examples, args)
    ref.write_reference(out, losses, lrs, norms, args)

    from transformers import LlamaForCausalLM
    from transformers.trainer_pt_utils import LabelSmoother

    def label_smoothing(logits, labels, n_tokens):
        return LabelSmoother(epsilon=0.1)({"logits": logits}, labels, shift_labels=True, num_items_in_batch=n_tokens)

    def dft(logits, labels, n_tokens):
        shift = labels[:, 1:]
        mask = shift != -100
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, shift.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        per_token = -logp * logp.exp().detach()
        return (per_token * mask).sum() / max(n_tokens, 1)

    token_metrics(out, examples, args)

    variant_args = argparse.Namespace(**{**vars(args), "steps": 10})
    for name, fn in (("label_smoothing", label_smoothing), ("dft", dft)):
        m = LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32, attn_implementation="eager")
        ref.add_pad_row(m)
        v_losses, v_lrs, v_norms = ref.train(m, list(m.named_parameters()), examples, variant_args, loss_fn=fn)
        (out / f"reference_{name}.json").write_text(json.dumps(
            {"losses": v_losses, "learning_rates": v_lrs, "grad_norms": v_norms, "config": {"steps": 10}}, indent=1))
        print(name, [round(x, 4) for x in v_losses])

    # --optim adamw_8bit / paged_adamw_32bit / lion_8bit / lion_32bit: bitsandbytes' AdamW and Lion as transformers' Trainer builds them
    # (_get_bitsandbytes_optimizer; at 8 bits create_optimizer's 32-bit override for nn.Embedding
    # modules), on its CPU kernels.
    import bitsandbytes as bnb

    def bnb_optimizer(cls, bits, **kwargs):
        """cls (bnb.optim.AdamW or Lion) at `bits`, with create_optimizer's 32-bit override for nn.Embedding
        modules at 8 bits."""
        def make(groups, model):
            opt = cls(groups, lr=args.lr, optim_bits=bits, is_paged=bits == 32, **kwargs)
            if bits == 8:
                for module in model.modules():
                    if isinstance(module, torch.nn.Embedding):
                        bnb.optim.GlobalOptimManager.get_instance().register_module_override(module, "weight",
                                                                                             {"optim_bits": 32})
            return opt
        return make

    adamw_kwargs = {"betas": (0.9, 0.999), "eps": 1e-8}
    lion_kwargs = {"betas": (0.9, 0.999)}  # transformers passes Lion the betas (adam_beta1, adam_beta2) only
    for name, make in (("adamw_8bit", bnb_optimizer(bnb.optim.AdamW, 8, **adamw_kwargs)),
                       ("paged_adamw_32bit", bnb_optimizer(bnb.optim.AdamW, 32, **adamw_kwargs)),
                       ("lion_8bit", bnb_optimizer(bnb.optim.Lion, 8, **lion_kwargs)),
                       ("lion_32bit", bnb_optimizer(bnb.optim.Lion, 32, **lion_kwargs))):
        m = LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32, attn_implementation="eager")
        ref.add_pad_row(m)
        v_losses, v_lrs, v_norms = ref.train(m, list(m.named_parameters()), examples, variant_args,
                                             make_optimizer=make)
        (out / f"reference_{name}.json").write_text(json.dumps(
            {"losses": v_losses, "learning_rates": v_lrs, "grad_norms": v_norms, "config": {"steps": 10}}, indent=1))
        print(name, [round(x, 4) for x in v_losses])

    # --optim adafactor: transformers' Adafactor with the kwargs its Trainer passes (_get_adafactor).
    from transformers.optimization import Adafactor

    m = LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32, attn_implementation="eager")
    ref.add_pad_row(m)
    v_losses, v_lrs, v_norms = ref.train(
        m, list(m.named_parameters()), examples, variant_args,
        make_optimizer=lambda groups, model: Adafactor(groups, lr=args.lr, scale_parameter=False, relative_step=False))
    (out / "reference_adafactor.json").write_text(json.dumps(
        {"losses": v_losses, "learning_rates": v_lrs, "grad_norms": v_norms, "config": {"steps": 10}}, indent=1))
    print("adafactor", [round(x, 4) for x in v_losses])


if __name__ == "__main__":
    main()
