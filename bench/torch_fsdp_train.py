"""The PyTorch side of the benchmark: transformers' LlamaForCausalLM under PyTorch's own FSDP
(fully_shard, i.e. FSDP2; --fsdp1 for FullyShardedDataParallel) with the Gloo backend on CPU
(or NCCL with --device cuda, for scripts/gpu_check.sh), launched by torchrun. It trains on exactly the sequences bench.py prepared (bench_data.pt:
input_ids and labels, already tokenized, every one model_max_length long) with torch AdamW and
HF's loss, and writes per-step wall times and each rank's peak RSS to --out (JSON, rank 0).

  torchrun --nproc_per_node 2 bench/torch_fsdp_train.py --model_dir M --data D --out r.json \
      --per_device_batch 4 --grad_accum 1 --steps 10 --dtype fp32 --threads 1
"""
import argparse
import contextlib
import json
import os
import resource
import time

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model_dir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--per_device_batch", type=int, default=4)
    ap.add_argument("--grad_accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--fsdp1", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--grad_ckpt", action="store_true", help="activation checkpointing of every decoder layer")
    ap.add_argument("--offload", action="store_true", help="FSDP CPU offload of parameters, gradients, optimizer")
    ap.add_argument("--lora_r", type=int, default=0,
                    help="> 0: peft LoRA (r, alpha 2r, q_proj v_proj, no dropout) on the frozen base, as TRL --use_peft")
    ap.add_argument("--load_in_4bit", action="store_true",
                    help="QLoRA (needs --lora_r): transformers' BitsAndBytesConfig nf4 + double quant, compute dtype = "
                    "--dtype, bitsandbytes' CPU Linear4bit; no FSDP (its 4-bit Params4bit cannot be flattened), "
                    "DistributedDataParallel over the adapters at world > 1, torch.autocast for bf16 as HF Trainer")
    ap.add_argument("--profile", help="write a per-phase / per-kind profile of the steps after --profile_skip here "
                    "(bench/profile_step.py; the last step under torch.profiler)")
    ap.add_argument("--profile_skip", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cuda.matmul.allow_tf32 = True
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    if args.load_in_4bit:
        model, optim = load_qlora(args, world)
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.dtype == "bf16" else contextlib.nullcontext
    else:
        model, optim = load_fsdp(args, cuda, dev)
        autocast = contextlib.nullcontext
    train_loop(args, model, optim, autocast, rank, world, cuda, dev)


def load_qlora(args, world: int):
    """transformers + bitsandbytes 4-bit base + peft LoRA (q_proj v_proj), as the QLoRA recipe loads it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    assert args.lora_r > 0, "--load_in_4bit needs --lora_r"
    cdt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=cdt)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, quantization_config=qcfg, dtype=cdt, device_map="cpu",
                                                 attn_implementation="sdpa")
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    model.config.use_cache = False
    # peft keeps the adapters in fp32 (autocast_adapter_dtype), as alpaca-train's trainable master weights.
    model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, betas=(0.9, 0.999),
                              eps=1e-8, weight_decay=0.0)
    return model, optim


def load_fsdp(args, cuda: bool, dev):
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    # fp32 master weights as Alpaca's train.py loads them; bf16 = FSDP mixed precision.
    model = LlamaForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    if args.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        if args.dtype == "bf16":  # the frozen base in bf16 (FSDP2 keeps each parameter's dtype), adapters fp32
            for n, p in model.named_parameters():
                if not p.requires_grad:
                    p.data = p.data.to(torch.bfloat16)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cuda and not args.offload:
        model = model.to(dev)
    mp_dtype = torch.bfloat16 if args.dtype == "bf16" else None
    if args.fsdp1:
        from functools import partial

        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        mp = MixedPrecision(param_dtype=mp_dtype, reduce_dtype=mp_dtype, buffer_dtype=mp_dtype) if mp_dtype else None
        model = FSDP(model, auto_wrap_policy=partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}),
                     sharding_strategy=ShardingStrategy.FULL_SHARD, mixed_precision=mp, device_id=None,
                     use_orig_params=True)
    else:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=mp_dtype) if mp_dtype else MixedPrecisionPolicy()
        off = CPUOffloadPolicy(pin_memory=cuda) if args.offload else OffloadPolicy()
        layers = model.base_model.model.model.layers if args.lora_r > 0 else model.model.layers
        for layer in layers:
            fully_shard(layer, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    return model, optim


def train_loop(args, model, optim, autocast, rank: int, world: int, cuda: bool, dev) -> None:
    prof_mod = timer = timer_prof = None
    if args.profile:
        import torch_step_profile as prof_mod

        prof_mod.install_scopes(model)
        timer, timer_prof = prof_mod.PhaseTimer(), prof_mod.PhaseTimer()
    data = torch.load(args.data)
    input_ids, labels = data["input_ids"], data["labels"]
    n, seq = input_ids.shape
    global_batch = args.per_device_batch * args.grad_accum * world
    step_times, losses = [], []
    cursor = 0
    profiler = None
    for step in range(args.steps):
        t0 = time.perf_counter()
        ph = contextlib.nullcontext
        if args.profile and step >= args.profile_skip:
            tm = timer_prof if step == args.steps - 1 else timer
            tm.steps += 1
            ph = tm.phase
            if step == args.steps - 1:
                # Input shapes and dtypes: each op's operand bytes (torch_step_profile.py).
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
                profiler.__enter__()
        # The global batch in example order; rank r takes every world-th micro-batch slice, as ours does.
        idx = [(cursor + i) % n for i in range(global_batch)]
        cursor += global_batch
        batch_ids, batch_labels = input_ids[idx], labels[idx]
        num_tokens = int((batch_labels[:, 1:] != -100).sum())
        step_loss = 0.0
        for micro in range(args.grad_accum):
            lo = (micro * world + rank) * args.per_device_batch
            ids = batch_ids[lo:lo + args.per_device_batch].to(dev)
            lab = batch_labels[lo:lo + args.per_device_batch].to(dev)
            with ph("forward"), autocast():
                logits = model(input_ids=ids).logits
                with record_function("cat:loss"):
                    loss_sum = torch.nn.functional.cross_entropy(
                        logits.float()[:, :-1].reshape(-1, logits.size(-1)), lab[:, 1:].reshape(-1), ignore_index=-100,
                        reduction="sum")
            # Sum of token losses / global token count, times world because FSDP averages gradients.
            with ph("backward"):
                (loss_sum * world / num_tokens).backward()
            step_loss += loss_sum.item() / num_tokens
        with ph("optimizer"):
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            optim.step()
            optim.zero_grad(set_to_none=True)
        t = torch.tensor([step_loss], dtype=torch.float64, device=dev)
        dist.all_reduce(t)
        if cuda:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        if profiler is not None:
            profiler.__exit__(None, None, None)
            out = prof_mod.summarize(profiler, timer_prof)
            out["phases_unprofiled"] = {p: {"cpu_s": timer.cpu[p] / max(timer.steps, 1),
                                            "wall_s": timer.wall[p] / max(timer.steps, 1)} for p in timer.cpu}
            out["step_times"] = step_times
            os.makedirs(args.profile, exist_ok=True)
            with open(os.path.join(args.profile, f"torch_rank{rank}.json"), "w") as f:
                json.dump(out, f, indent=1)
            profiler = None
        losses.append(float(t.item()))

    rss = torch.tensor([peak_rss_bytes()], dtype=torch.int64, device=dev)
    gathered = [torch.zeros_like(rss) for _ in range(world)]
    dist.all_gather(gathered, rss)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"impl": impl_name(args), "world": world, "seq_len": seq,
                       "global_batch": global_batch, "tokens_per_step": global_batch * seq,
                       "step_times": step_times, "losses": losses,
                       "peak_rss_bytes_per_rank": [int(g.item()) for g in gathered],
                       "torch": torch.__version__,
                       **({"gpu_peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                           "gpu_peak_reserved_bytes": torch.cuda.max_memory_reserved()} if cuda else {})}, f, indent=1)
    dist.destroy_process_group()


def impl_name(args) -> str:
    if args.load_in_4bit:
        return "transformers_bnb4bit_peft" + ("_ddp" if dist.get_world_size() > 1 else "")
    return "pytorch_fsdp1" if args.fsdp1 else "pytorch_fsdp2"


if __name__ == "__main__":
    main()
