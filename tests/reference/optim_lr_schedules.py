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


if __name__ == "__main__":
    main()
