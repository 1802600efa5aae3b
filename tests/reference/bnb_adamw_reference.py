"""Reference for tests/optim/test_bnb_adamw: bitsandbytes' AdamW and Lion as transformers 5's Trainer builds them
for --optim adamw_bnb_8bit / adamw_8bit / paged_adamw_8bit (optim_bits 8) and paged_adamw_32bit
(optim_bits 32; paging has no meaning on CPU, where bitsandbytes falls back to plain buffers), run
by bitsandbytes' CPU kernels.

Writes into --out:
  qmaps.safetensors      bitsandbytes' dynamic quantization maps ("dynamic" signed: the first moment;
                         "udynamic" unsigned: the second), as the optimizer fills them
  bnb_adamw{8,32}.safetensors, bnb_lion{8,32}.safetensors (Lion: "state1" / "absmax1" only)
                         the initial parameters ("init.<name>"), every step's gradients
                         ("grad.<step>.<name>"), and after every step the parameters ("param.<step>.<name>")
                         and the optimizer state (8-bit: "state1/state2.<step>.<name>" uint8 codes and
                         "absmax1/absmax2.<step>.<name>" per 256-element block; 32-bit: fp32 moments)
  bnb_adamw.json         the parameters' names, shapes, weight-decay groups, the learning rates per step,
                         betas / eps / weight decay, and what transformers' _get_bitsandbytes_optimizer
                         returns for each optim name (the class and its kwargs)

The parameters are shaped to cover each rule: an nn.Embedding's weight (transformers registers a
32-bit override for nn.Embedding modules under 8-bit), weights of whole 256-element blocks and with a
short last block, one just under min_8bit_size (4096: 32-bit moments), norm weights and a bias (no
weight decay), values of mixed sign and scale so blocks whose largest magnitude is negative (the
signed map's -0.993, not -1) occur, and blocks of zero moments (zero gradients: scale 0, code 0).
"""
import argparse
import json
import os

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from safetensors.torch import save_file
    from torch import nn
    from transformers import TrainingArguments
    from transformers.trainer_optimizer import OptimizerContext, _get_bitsandbytes_optimizer

    save_file({"dynamic": F.create_dynamic_map(signed=True), "udynamic": F.create_dynamic_map(signed=False)},
              os.path.join(args.out, "qmaps.safetensors"))

    # transformers' wiring: class and kwargs per optim name.
    wiring = {}
    for name in ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "lion_8bit", "lion_32bit",
                 "paged_lion_8bit", "paged_lion_32bit"):
        targs = TrainingArguments(output_dir=os.path.join(args.out, "t"), optim=name, learning_rate=3e-4,
                                  adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.1, report_to=[],
                                  use_cpu=True)
        ctx = OptimizerContext(args=targs, model=None, optimizer_kwargs={"lr": targs.learning_rate},
                               adam_kwargs={"betas": (targs.adam_beta1, targs.adam_beta2), "eps": targs.adam_epsilon},
                               optim_args={})
        cls, kwargs = _get_bitsandbytes_optimizer(ctx)
        wiring[name] = {"class": f"{cls.__module__}.{cls.__name__}",
                        "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}}

    shapes = {  # name: (shape, decay)
        "embed_tokens.weight": ((97, 48), True),   # nn.Embedding: 32-bit override under 8-bit
        "q_proj.weight": ((64, 48), True),         # 3072 elements: under min_8bit_size, 32-bit
        "o_proj.weight": ((128, 64), True),        # 8192: 32 whole blocks
        "up_proj.weight": ((75, 61), True),        # 4575: 17 blocks and one of 223
        "down_proj.weight": ((61, 75), True),
        "lm_head.weight": ((97, 48), True),        # 4656: 18 blocks and one of 48
        "norm.weight": ((48,), False),
        "bias": ((4099,), False),                  # 8-bit without decay, a 3-element last block
    }

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(*shapes["embed_tokens.weight"][0])
            self.p = nn.ParameterDict({n.replace(".", "_"): nn.Parameter(torch.empty(s))
                                       for n, (s, _) in shapes.items() if n != "embed_tokens.weight"})

        def named(self):
            out = {"embed_tokens.weight": self.embed_tokens.weight}
            for n in shapes:
                if n != "embed_tokens.weight":
                    out[n] = self.p[n.replace(".", "_")]
            return out

    g = torch.Generator().manual_seed(32)
    lrs = [1e-3 * (1 + 0.5 * ((-1) ** s)) / (1 + s) for s in range(args.steps)]
    betas, eps, wd = (0.9, 0.999), 1e-8, 0.05
    meta = {"params": [{"name": n, "shape": list(s), "decay": d} for n, (s, d) in shapes.items()], "lrs": lrs,
            "beta1": betas[0], "beta2": betas[1], "eps": eps, "weight_decay": wd, "steps": args.steps,
            "wiring": wiring}
    for kind, bits in (("adamw", 8), ("adamw", 32), ("lion", 8), ("lion", 32)):
        torch.manual_seed(0)
        model = Model()
        params = model.named()
        with torch.no_grad():
            for n, p in params.items():
                # mixed scales per row so absmax blocks differ; a negative outlier in some blocks
                p.copy_(torch.randn(p.shape, generator=g) * 0.02 * (1 + torch.rand(p.shape, generator=g)))
        out = {f"init.{n}": p.detach().clone() for n, p in params.items()}
        groups = [{"params": [params[n] for n, (_, d) in shapes.items() if d], "weight_decay": wd},
                  {"params": [params[n] for n, (_, d) in shapes.items() if not d], "weight_decay": 0.0}]
        if kind == "adamw":
            opt = bnb.optim.AdamW(groups, lr=lrs[0], betas=betas, eps=eps, optim_bits=bits, is_paged=bits == 32)
        else:  # transformers passes Lion only the betas
            opt = bnb.optim.Lion(groups, lr=lrs[0], betas=betas, optim_bits=bits, is_paged=bits == 32)
        if bits == 8:  # Trainer.create_optimizer: nn.Embedding weights in 32 bits
            bnb.optim.GlobalOptimManager.get_instance().register_module_override(model.embed_tokens, "weight",
                                                                                 {"optim_bits": 32})
        for step in range(args.steps):
            for n, p in params.items():
                grad = torch.randn(p.shape, generator=g) * (0.1 if step % 2 else 1e-3)
                if n == "o_proj.weight":
                    grad[:, :3] = -2.0  # blocks whose largest magnitude is negative
                if n == "down_proj.weight" and step < 2:
                    grad[:20] = 0.0  # blocks of zeros (a LoRA B's first steps): scale 0, code 0
                p.grad = grad
                out[f"grad.{step}.{n}"] = grad.clone()
            for group in opt.param_groups:
                group["lr"] = lrs[step]
            opt.step()
            for n, p in params.items():
                out[f"param.{step}.{n}"] = p.detach().clone()
                st = opt.state[p]
                for k in ("state1", "state2", "absmax1", "absmax2"):
                    if k in st:
                        out[f"{k}.{step}.{n}"] = st[k].clone()
        save_file(out, os.path.join(args.out, f"bnb_{kind}{bits}.safetensors"))
        kinds = {n: str(opt.state[p]["state1"].dtype) for n, p in params.items()}
        meta[f"state_dtype{bits}" if kind == "adamw" else f"lion_state_dtype{bits}"] = kinds
        assert kind == "adamw" or all("state2" not in opt.state[p] for p in params.values())
        print(f"{kind} {bits}-bit: " + ", ".join(f"{n} {k.replace('torch.', '')}" for n, k in kinds.items()))
    with open(os.path.join(args.out, "bnb_adamw.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
