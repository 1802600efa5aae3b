"""Reference for tests/optim/test_adafactor: transformers' Adafactor as its Trainer builds it for
--optim adafactor (trainer_optimizer.py _get_adafactor: the class with lr, scale_parameter=False,
relative_step=False, and the class's other defaults; weight decay per parameter group as
Trainer.create_optimizer groups them).

Writes into --out:
  adafactor.safetensors  the initial parameters ("init.<name>"), every step's gradients
                         ("grad.<step>.<name>"), and after every step the parameters
                         ("param.<step>.<name>") and the optimizer state as torch's Adafactor names it
                         ("exp_avg_sq_row.<step>.<name>" / "exp_avg_sq_col.<step>.<name>" for a matrix,
                         "exp_avg_sq.<step>.<name>" for a vector)
  adafactor.json         the parameters' names, shapes, weight-decay groups, the learning rates per
                         step, the weight decay, and what transformers builds for --optim adafactor
                         (the class and its kwargs, the class defaults the run relies on)

The parameters cover each rule: matrices of several shapes (factored statistics; a tall one, a wide
one, one column), vectors (an RMSNorm weight and a bias without weight decay: per-element statistics),
gradients of large and small scale so some steps clip at the update RMS of 1 and some do not, and an
all-zero gradient row.
"""
import argparse
import inspect
import json
import os

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from safetensors.torch import save_file
    from transformers import TrainingArguments
    from transformers.optimization import Adafactor
    from transformers.trainer_optimizer import OptimizerContext, _get_adafactor

    targs = TrainingArguments(output_dir=os.path.join(args.out, "t"), optim="adafactor", learning_rate=3e-4,
                              weight_decay=0.1, report_to=[], use_cpu=True)
    ctx = OptimizerContext(args=targs, model=None, optimizer_kwargs={"lr": targs.learning_rate},
                           adam_kwargs={"betas": (targs.adam_beta1, targs.adam_beta2), "eps": targs.adam_epsilon},
                           optim_args={})
    cls, kwargs = _get_adafactor(ctx)
    defaults = {k: v.default for k, v in inspect.signature(Adafactor.__init__).parameters.items()
                if v.default is not inspect.Parameter.empty}
    wiring = {"class": f"{cls.__module__}.{cls.__name__}",
              "kwargs": {k: v for k, v in kwargs.items()},
              "defaults": {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}}

    shapes = {  # name: (shape, decay)
        "embed_tokens.weight": ((97, 48), True),
        "q_proj.weight": ((64, 48), True),
        "up_proj.weight": ((75, 61), True),
        "down_proj.weight": ((61, 75), True),
        "lm_head.weight": ((97, 48), True),
        "score.weight": ((33, 1), True),   # one column
        "norm.weight": ((48,), False),
        "bias": ((4099,), False),
    }
    g = torch.Generator().manual_seed(33)
    lrs = [1e-3 * (1 + 0.5 * ((-1) ** s)) / (1 + s) for s in range(args.steps)]
    wd = 0.05
    params = {n: torch.nn.Parameter(torch.randn(s, generator=g) * 0.02 * (1 + torch.rand(s, generator=g)))
              for n, (s, _) in shapes.items()}
    out = {f"init.{n}": p.detach().clone() for n, p in params.items()}
    groups = [{"params": [params[n] for n, (_, d) in shapes.items() if d], "weight_decay": wd},
              {"params": [params[n] for n, (_, d) in shapes.items() if not d], "weight_decay": 0.0}]
    opt = cls(groups, **{k: v for k, v in kwargs.items() if k != "lr"}, lr=lrs[0])
    for step in range(args.steps):
        for n, p in params.items():
            grad = torch.randn(p.shape, generator=g) * (1e-3 if step % 2 else 0.5)
            if n == "up_proj.weight":
                grad[3] = 0.0  # a zero row: its statistic is eps until others move it
            p.grad = grad
            out[f"grad.{step}.{n}"] = grad.clone()
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.step()
        for n, p in params.items():
            out[f"param.{step}.{n}"] = p.detach().clone()
            st = opt.state[p]
            for key in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"):
                if key in st:
                    out[f"{key}.{step}.{n}"] = st[key].clone()
    save_file(out, os.path.join(args.out, "adafactor.safetensors"))
    meta = {"params": [{"name": n, "shape": list(s), "decay": d} for n, (s, d) in shapes.items()], "lrs": lrs,
            "weight_decay": wd, "steps": args.steps, "wiring": wiring,
            "state_keys": {n: sorted(k for k in opt.state[p] if isinstance(opt.state[p][k], torch.Tensor)
                                     and opt.state[p][k].dim() > 0) for n, p in params.items()}}
    with open(os.path.join(args.out, "adafactor.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
