"""Writes the learning rate of every HF schedule at every step, from transformers.get_scheduler,
for tests/optim/test_lr_schedule.cpp. Usage: optim_lr_schedules.py --out DIR"""
import argparse
import json
import os

import torch
from transformers import get_scheduler

CASES = [
    # name, warmup, total, scheduler_specific_kwargs
    ("linear", 3, 20, {}),
    ("linear", 0, 7, {}),
    ("cosine", 3, 20, {}),
    ("cosine", 1, 5, {"num_cycles": 1.5}),
    ("cosine_with_restarts", 2, 20, {"num_cycles": 3}),
    ("cosine_with_restarts", 0, 10, {}),
    ("polynomial", 4, 20, {"power": 2.0, "lr_end": 1e-5}),
    ("polynomial", 2, 12, {}),
    ("constant", 0, 10, {}),
    ("constant_with_warmup", 5, 15, {}),
    ("inverse_sqrt", 4, 30, {}),
    ("inverse_sqrt", 0, 30, {"timescale": 7}),
    ("cosine_with_min_lr", 3, 20, {"min_lr": 1e-5}),
    ("cosine_with_min_lr", 2, 16, {"min_lr_rate": 0.1, "num_cycles": 0.7}),
    ("cosine_warmup_with_min_lr", 3, 20, {"min_lr": 1e-5}),
    ("cosine_warmup_with_min_lr", 4, 16, {"min_lr_rate": 0.1, "warmup_lr_rate": 0.2, "num_cycles": 0.7}),
    ("warmup_stable_decay", 3, 20, {"num_decay_steps": 6}),
    ("warmup_stable_decay", 4, 24, {"num_decay_steps": 8, "num_stable_steps": 5, "warmup_type": "cosine",
                                    "decay_type": "1-sqrt", "min_lr_ratio": 0.1}),
    ("warmup_stable_decay", 2, 16, {"num_decay_steps": 6, "warmup_type": "1-sqrt", "decay_type": "linear"}),
    ("warmup_stable_decay", 0, 16, {"num_decay_steps": 10, "num_cycles": 1.0, "min_lr_ratio": 0.05}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    base_lr = 3e-4
    records = []
    for name, warmup, total, kwargs in CASES:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=base_lr)
        sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total,
                              scheduler_specific_kwargs=kwargs)
        lrs = []
        for _ in range(total + 3):  # a few steps past the end, as polynomial treats them specially
            lrs.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        records.append({"name": name, "warmup": warmup, "total": total, "kwargs": kwargs,
                        "base_lr": base_lr, "lrs": lrs})
    with open(os.path.join(args.out, "lr_schedules.json"), "w") as f:
        json.dump(records, f, indent=1)
    # reduce_lr_on_plateau: torch's ReduceLROnPlateau (what get_scheduler returns for it) stepped
    # with a metric per evaluation, as HF's _evaluate steps it; the lr after each step.
    metrics = [3.0, 2.5, 2.5, 2.4999, 2.6, 2.7, 2.2, 2.2, 2.21, 2.3, 2.25, 1.9, 1.9, 1.95, 2.0, 2.0]
    plateau = []
    for kwargs in [{}, {"patience": 0}, {"patience": 1, "factor": 0.5, "cooldown": 2},
                   {"mode": "max", "patience": 0, "factor": 0.3, "min_lr": 1e-4},
                   {"patience": 1, "threshold": 0.05, "threshold_mode": "abs", "factor": 0.5},
                   {"patience": 0, "factor": 0.999999, "eps": 1e-3}]:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=base_lr)
        sched = get_scheduler("reduce_lr_on_plateau", opt, scheduler_specific_kwargs=kwargs)
        lrs = []
        for m in metrics:
            sched.step(m)
            lrs.append(opt.param_groups[0]["lr"])
        plateau.append({"kwargs": kwargs, "base_lr": base_lr, "metrics": metrics, "lrs": lrs})
    with open(os.path.join(args.out, "plateau.json"), "w") as f:
        json.dump(plateau, f, indent=1)


if __name__ == "__main__":
    main()
