"""Writes tests/fixtures/deepspeed_lr/deepspeed_lr_schedules.json: the learning rates DeepSpeed's own
scheduler classes (deepspeed/runtime/lr_schedules.py) give, stepped as DeepSpeedEngine steps them
under HF Trainer (constructed before the first optimizer step, .step() after each applied one):
"used" = the optimizer's lr during optimizer step k, "logged" = get_last_lr() after step k (what
HF Trainer logs with --deepspeed). The JSON is committed (DeepSpeed is not a test dependency: its
sdist builds ops against torch); regenerate with DeepSpeed installed:

  pip install --no-deps --target /tmp/ds deepspeed==0.19.8
  PYTHONPATH=/tmp/ds .venv/bin/python tests/reference/deepspeed_lr_schedules.py --out tests/fixtures/deepspeed_lr

Only lr_schedules.py is loaded (its package imports need CUDA-less stubs for deepspeed.utils.logger).
"""
import argparse
import importlib.util
import json
import logging
import os
import sys
import types

import torch


def load_lr_schedules():
    import importlib.util as iu
    spec = iu.find_spec("deepspeed")
    root = os.path.dirname(spec.origin) if spec and spec.origin else None
    if root is None:
        for p in sys.path:
            if os.path.isdir(os.path.join(p, "deepspeed")):
                root = os.path.join(p, "deepspeed")
                break
    pkg = types.ModuleType("deepspeed")
    utils = types.ModuleType("deepspeed.utils")
    utils.logger = logging.getLogger("deepspeed")
    sys.modules["deepspeed"] = pkg
    sys.modules["deepspeed.utils"] = utils
    from importlib.metadata import version as dist_version
    version = dist_version("deepspeed")
    s = importlib.util.spec_from_file_location("lr_schedules", os.path.join(root, "runtime", "lr_schedules.py"))
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod, version


def run(mod, name, params, steps, lr):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sch = getattr(mod, name)(opt, **params)
    used, logged = [], []
    for _ in range(steps):
        used.append(opt.param_groups[0]["lr"])
        sch.step()
        logged.append(sch.get_last_lr()[0])
    return used, logged


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    mod, version = load_lr_schedules()
    lr = 3e-3
    cases = []
    for warmup_type in ("log", "linear"):
        for warmup in (1, 2, 3, 10):
            for total in (8, 25):
                for min_lr in (0.0, 1e-5):
                    common = {"warmup_num_steps": warmup, "warmup_type": warmup_type}
                    cases.append(("WarmupLR", dict(common, warmup_min_lr=min_lr, warmup_max_lr=lr), total))
                    cases.append(("WarmupDecayLR", dict(common, warmup_min_lr=min_lr, warmup_max_lr=lr,
                                                        total_num_steps=total), total))
                cases.append(("WarmupCosineLR", dict(common, total_num_steps=total), total))
                cases.append(("WarmupCosineLR", dict(common, total_num_steps=total, warmup_min_ratio=0.1,
                                                     cos_min_ratio=0.05), total))
    # DeepSpeed's defaults where a key is absent: WarmupLR peaks at the optimizer's lr,
    # WarmupDecayLR at 0.001, warmup over 1000 steps.
    cases.append(("WarmupLR", {"warmup_num_steps": 4}, 10))
    cases.append(("WarmupDecayLR", {"total_num_steps": 12, "warmup_num_steps": 4}, 12))
    out = []
    for name, params, total in cases:
        used, logged = run(mod, name, params, total + 3, lr)
        out.append({"type": name, "params": params, "base_lr": lr, "total": total, "used": used, "logged": logged})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "deepspeed_lr_schedules.json"), "w") as f:
        # One case per line: {"source": ..., "cases": [...]}
        f.write('{"source": ' + json.dumps("deepspeed " + version + " runtime/lr_schedules.py") + ',\n"cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in out))
        f.write("\n]}\n")
    print(f"{len(out)} cases")


if __name__ == "__main__":
    main()
