"""Reference for tests/data/test_batch_rebalance: transformers 5's train_sampling_strategy
"batch_rebalance" (trainer_pt_utils.BatchRebalanceSampler, built by Trainer._get_train_sampler).

Writes --out/batch_rebalance.json:
  "cases":   [{"lengths", "effective", "world", "grad_accum", "drop_last", "epochs": [[rank][micro-batch]
             indices...]}]: every rank's micro-batches, in the order the real sampler yields them, for
             two epochs (set_epoch(0), set_epoch(1)); lengths drawn as SFT data looks (uniform, long
             tails, a few very long rows among short ones, all equal, ties) so the balancing's hill
             climb, its cycle detection and the freeze of a slot whose costliest group is one row all run;
             "set_order_matters": whether walking the frozen slot's groups in sorted order instead of
             CPython's set order would change the result (true for the last case, found by search)
  "trainer": how Trainer._get_train_sampler builds it from TrainingArguments (world 1): the
             effective batch, seed, shuffle and drop_last it passes, for a seed / data_seed other than 42
"""
import argparse
import json
import os
import random


def epochs_of(lengths, effective, world, grad_accum, drop_last):
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    out = []
    for epoch in range(2):
        ranks = []
        for rank in range(world):
            s = BatchRebalanceSampler(lengths=lengths, effective_batch_size=effective, dp_size=world,
                                      grad_accum=grad_accum, rank=rank, drop_last=drop_last)
            s.set_epoch(epoch)
            ranks.append([list(map(int, mb)) for mb in s])
        out.append(ranks)
    return out


def set_order_matters(lengths, effective, world, grad_accum, drop_last):
    """Whether _relieve_and_freeze's walk over the slot's groups (a set) in sorted order changes anything."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    original = BatchRebalanceSampler._slot_groups
    BatchRebalanceSampler._slot_groups = lambda self, costs, pivot: sorted(original(self, costs, pivot))
    try:
        return epochs_of(lengths, effective, world, grad_accum, drop_last)
    finally:
        BatchRebalanceSampler._slot_groups = original


# A global batch (4 ranks x accumulation 3: 12 groups) where a frozen slot's groups, numbers past the
# set's 8 hash slots, are topped up in CPython's table order and sorted order would give other
# micro-batches: found by random search, 1 in ~3000 draws.
SET_ORDER_LENGTHS = [570, 64, 101, 101, 149, 82, 211, 53, 79, 122, 325, 317, 39, 267, 343, 133, 334, 96, 18, 128, 79,
                     230, 29, 80]


def draw_lengths(rng, n, kind):
    if kind == "uniform":
        return [rng.randint(8, 512) for _ in range(n)]
    if kind == "lognormal":  # instruction data: most rows short, a long tail
        return [max(1, min(4096, int(rng.lognormvariate(4.5, 0.9)))) for _ in range(n)]
    if kind == "outliers":  # a few rows far longer than the rest: single-row groups get frozen
        return [rng.choice([2000, 3000, 4096]) if rng.random() < 0.06 else rng.randint(5, 40) for _ in range(n)]
    if kind == "equal":
        return [128] * n
    if kind == "set_order":
        return list(SET_ORDER_LENGTHS)
    if kind == "ties":
        return [rng.choice([16, 32, 64, 256]) for _ in range(n)]
    raise ValueError(kind)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(32)
    # (examples, length kind, per-device batch, world, grad_accum, drop_last)
    shapes = [(97, "uniform", 4, 2, 2, False), (97, "uniform", 4, 2, 2, True), (200, "lognormal", 8, 4, 2, False),
              (203, "lognormal", 3, 3, 3, False), (150, "outliers", 4, 4, 4, False), (150, "outliers", 2, 8, 1, False),
              (64, "equal", 4, 2, 2, False), (70, "ties", 5, 2, 3, False), (33, "ties", 1, 4, 2, False),
              (37, "uniform", 2, 4, 2, False), (300, "outliers", 16, 2, 4, False), (11, "uniform", 1, 1, 1, False),
              (500, "lognormal", 12, 8, 2, False), (129, "outliers", 6, 1, 8, True), (24, "set_order", 2, 4, 3, False)]
    cases = []
    for n, kind, per_device, world, ga, drop_last in shapes:
        lengths = draw_lengths(rng, n, kind)
        effective = per_device * ga * world  # Trainer: train_batch_size x accumulation x world
        epochs = epochs_of(lengths, effective, world, ga, drop_last)
        cases.append({"kind": kind, "lengths": lengths, "effective": effective, "world": world, "grad_accum": ga,
                      "drop_last": drop_last, "epochs": epochs,
                      "set_order_matters": epochs != set_order_matters(lengths, effective, world, ga, drop_last)})

    # Trainer's wiring, at world 1: what _get_train_sampler hands the sampler.
    import torch
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(1, 1)

        def forward(self, input_ids=None, labels=None):
            return {"loss": self.w.weight.sum()}

    ds = Dataset.from_dict({"input_ids": [[1] * (1 + i % 7) for i in range(40)]})
    targs = TrainingArguments(output_dir=os.path.join(args.out, "trainer"), per_device_train_batch_size=3,
                              gradient_accumulation_steps=2, seed=7, data_seed=9, report_to=[],
                              train_sampling_strategy="batch_rebalance", use_cpu=True)
    sampler = Trainer(model=Tiny(), args=targs, train_dataset=ds)._get_train_sampler()
    assert isinstance(sampler, BatchRebalanceSampler), type(sampler)
    trainer = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "seed": 7, "data_seed": 9,
               "effective": sampler.effective_batch_size, "sampler_seed": sampler.seed, "shuffle": sampler.shuffle,
               "drop_last": sampler.drop_last, "lengths": sampler.lengths}
    with open(os.path.join(args.out, "batch_rebalance.json"), "w") as f:
        json.dump({"cases": cases, "trainer": trainer}, f)
    print(f"{len(cases)} BatchRebalanceSampler cases ({sum(c['set_order_matters'] for c in cases)} where set order "
          f"matters); Trainer passes effective {trainer['effective']}, "
          f"seed {trainer['sampler_seed']} (its own seed {targs.seed}), drop_last {trainer['drop_last']}")


if __name__ == "__main__":
    main()
