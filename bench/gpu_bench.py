"""The training half of scripts/gpu_check.sh: one-rank NCCL training of LLaMA-shaped random
models (~1B and 7B shapes, bf16, sequence 2048, activation checkpointing, with and without CPU
offload) with alpaca-train and with PyTorch FSDP2 on the same model, data and batch, reporting
tokens/s, MFU against the GPU's dense bf16 peak, and peak GPU/host memory; for the --comm_shape
also the exposed communication time (the run again with fsdp_config force_collectives, against
the plain one-rank run that skips them), the planner's memory (estimate-memory --json) against
the measured peak, and host synchronisations per step; plus the gpu tests' figures (--figures).

  python bench/gpu_bench.py prepare --out .deps/gpu_check/data --shared ../shared
  python bench/gpu_bench.py run --bin build-gpu/alpaca-train --data .deps/gpu_check/data \
        --work /tmp/gpu_bench --out $OUT/gpu_check.json --budget_s 300
  python bench/gpu_bench.py plan ...    # prints the commands `run` would execute, runs nothing
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SHAPES = {
    # TinyLlama-1.1B's shape (GQA 32/4) and LLaMA-2-7B's; vocabulary 32001 = LLaMA-2 + [PAD].
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32),
}
SEQ = 2048
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def log(msg):
    print(f"[gpu_bench] {msg}", flush=True)


def num_params(shape, vocab=32001):
    d, i, L = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    hd = d // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * hd
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * i + 2 * d
    return L * per_layer + 2 * vocab * d + d


def flops_per_token(shape):
    # Same formula as alpaca::train::flops_per_token: 6N + 12 L D T.
    return 6 * num_params(shape) + 12 * shape["num_hidden_layers"] * shape["hidden_size"] * SEQ


def prepare(args):
    from bench import make_data

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shared = Path(args.shared) / "data"
    tok = shared / "llama2-tokenizer" / "tokenizer.model"
    alpaca = shared / "alpaca" / "alpaca_5000.json"
    shutil.copy(tok, out / "tokenizer.model")
    js, pt = make_data(out, alpaca, tok, SEQ, 48)
    log(f"prepared {js.name}, {pt.name}, tokenizer.model in {out}")


def write_model_config(d: Path, shape_name: str):
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32001, max_position_embeddings=4096,
               rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2, pad_token_id=32000,
               tie_word_embeddings=False, hidden_act="silu", initializer_range=0.02, torch_dtype="bfloat16",
               **SHAPES[shape_name])
    (d / "init_config.json").write_text(json.dumps(cfg, indent=1))
    return d / "init_config.json"


def commands(args, shape_name, work: Path):
    """(name, kind, argv, env) for every run of one shape."""
    model_dir = work / f"model_{shape_name}"
    data = Path(args.data)
    cfg = model_dir / "init_config.json"
    cmds = [("init_" + shape_name, "init",
             [args.bin, "init-model", "--config", str(cfg), "--output_dir", str(model_dir), "--dtype", "bfloat16"])]
    batch = args.batch_1b if shape_name == "1b" else args.batch_7b
    for offload in (False, True):
        tag = f"{shape_name}_{'offload' if offload else 'gpu'}"
        out_dir = work / f"out_{tag}"
        ours = [args.bin, "--model_name_or_path", str(model_dir), "--data_path", str(data / f"data_{SEQ}.json"),
                "--output_dir", str(out_dir), "--overwrite_output_dir", "True", "--bf16", "True", "--tf32", "True",
                "--max_steps", str(args.steps), "--per_device_train_batch_size", str(batch),
                "--gradient_accumulation_steps", "1", "--model_max_length", str(SEQ), "--gradient_checkpointing", "True",
                "--learning_rate", "2e-5", "--lr_scheduler_type", "constant", "--logging_steps", "1",
                "--save_strategy", "no", "--report_to", "jsonl",
                "--fsdp", "full_shard auto_wrap offload" if offload else "full_shard auto_wrap",
                "--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer"]
        cmds.append(("ours_" + tag, "ours", ours))
        if shape_name == args.comm_shape and not offload:
            # The same run with the collectives forced at world 1 (fsdp_config force_collectives):
            # its step time minus the plain run's (collectives skipped) is the exposed
            # communication time of the NCCL path.
            forced = list(ours)
            forced[forced.index("--output_dir") + 1] = str(work / f"out_{tag}_forced")
            forced += ["--fsdp_config", '{"force_collectives": true}']
            cmds.append(("ours_" + tag + "_forced", "ours", forced))
            # The planner's figure for the same flags (memory per rank vs estimate-memory).
            est = [args.bin, "estimate-memory"] + ours[1:] + ["--num_gpus", "1", "--gpu_memory_gb", "141", "--json"]
            cmds.append(("estimate_" + tag, "estimate", est))
        torch_out = work / f"torch_{tag}.json"
        theirs = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                  str(HERE / "torch_fsdp_train.py"), "--model_dir", str(model_dir), "--data", str(data / f"data_{SEQ}.pt"),
                  "--out", str(torch_out), "--per_device_batch", str(batch), "--steps", str(args.steps),
                  "--dtype", "bf16", "--device", "cuda", "--grad_ckpt"] + (["--offload"] if offload else [])
        cmds.append(("torch_" + tag, "torch", theirs))
    return cmds


def parse_ours(out_dir: Path, warmup: int):
    steps, mem = [], {}
    tokens = None
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        e = json.loads(line)
        if "step_time" in e:
            steps.append(e["step_time"])
            tokens = e.get("tokens_per_step", tokens)
        for k in ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "host_peak_rss_bytes", "host_syncs_per_step"):
            if k in e:
                mem[k] = max(mem.get(k, 0), e[k])
    return steps[warmup:] or steps, tokens, mem


def run(args):
    import torch

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    log(f"device {name}, dense bf16 peak {peak}")
    deadline = time.time() + args.budget_s
    results = {"device": name, "peak_bf16_flops": peak, "seq_len": SEQ, "steps": args.steps, "runs": {}}
    for shape_name in args.shapes.split(","):
        write_model_config(work / f"model_{shape_name}", shape_name)
        fpt = flops_per_token(SHAPES[shape_name])
        for run_name, kind, argv in commands(args, shape_name, work):
            left = deadline - time.time()
            if left < 30:
                results["runs"][run_name] = {"skipped": f"time budget exhausted ({args.budget_s} s)"}
                log(f"{run_name}: skipped, budget exhausted")
                continue
            t0 = time.time()
            # NCCL_DEBUG=WARN: NCCL's own warnings reach the tail kept for a failed run.
            env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
            env.setdefault("NCCL_DEBUG", "WARN")
            try:
                p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=max(int(left), 1))
                rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
            except subprocess.TimeoutExpired:
                rc, tail = 124, "timed out"
            wall = time.time() - t0
            rec = {"rc": rc, "wall_s": round(wall, 1)}
            if rc != 0:
                rec["error"] = tail
                log(f"{run_name}: rc {rc} after {wall:.0f} s\n{tail[-800:]}")
                if -rc in CRASH_SIGNALS and kind == "ours" and not results.get("crash_backtrace"):
                    # Killed by a crash signal (the first GPU run: SIGSEGV with no usable backtrace): once,
                    # the same command under the debugger for the stack of every thread. Not for SIGKILL
                    # (the OOM killer: the rerun would only repeat it) or SIGTERM.
                    results["crash_backtrace"] = debugger_backtrace(argv, env, min(120, deadline - time.time()))
                    log(f"{run_name}: backtrace under the debugger\n{results['crash_backtrace'][-3000:]}")
                results["runs"][run_name] = rec
                if kind == "init":
                    break  # no model: nothing else of this shape can run
                continue
            if kind == "ours":
                out_dir = Path(argv[argv.index("--output_dir") + 1])
                steps, tokens, mem = parse_ours(out_dir, 1)
                rec.update(mem)
            elif kind == "torch":
                r = json.loads(Path(argv[argv.index("--out") + 1]).read_text())
                steps, tokens = r["step_times"][1:] or r["step_times"], r["tokens_per_step"]
                rec.update({k: r[k] for k in ("gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes") if k in r})
                rec["host_peak_rss_bytes"] = max(r["peak_rss_bytes_per_rank"])
            elif kind == "estimate":
                est = json.loads(p.stdout)
                rec.update({k: est[k] for k in ("device_total_bytes", "host_total_bytes", "fits") if k in est})
                results["runs"][run_name] = rec
                log(f"{run_name}: planner says {rec.get('device_total_bytes')} device bytes per rank")
                continue
            else:  # init: the trainer reads the tokenizer from the model directory
                shutil.copy(Path(args.data) / "tokenizer.model", work / f"model_{shape_name}" / "tokenizer.model")
                results["runs"][run_name] = rec
                log(f"{run_name}: ok in {wall:.0f} s")
                continue
            med = statistics.median(steps)
            tps = tokens / med
            rec.update(median_step_s=med, tokens_per_s=tps, mfu=(tps * fpt / peak) if peak else None)
            results["runs"][run_name] = rec
            log(f"{run_name}: {tps:.0f} tok/s, MFU {rec['mfu']}, {wall:.0f} s wall")
        runs = results["runs"]
        plain, forced = runs.get(f"ours_{shape_name}_gpu", {}), runs.get(f"ours_{shape_name}_gpu_forced", {})
        if plain.get("median_step_s") and forced.get("median_step_s"):
            runs[f"exposed_comm_{shape_name}"] = {
                "step_s_with_collectives": forced["median_step_s"], "step_s_collectives_skipped": plain["median_step_s"],
                "exposed_comm_s": forced["median_step_s"] - plain["median_step_s"],
                "exposed_comm_fraction": (forced["median_step_s"] - plain["median_step_s"]) / forced["median_step_s"]}
        est = runs.get(f"estimate_{shape_name}_gpu", {})
        if plain.get("gpu_peak_allocated_bytes") and est.get("device_total_bytes"):
            runs[f"memory_vs_plan_{shape_name}"] = {
                "measured_peak_allocated_bytes": plain["gpu_peak_allocated_bytes"],
                "planned_device_bytes": est["device_total_bytes"],
                "measured_over_planned": plain["gpu_peak_allocated_bytes"] / est["device_total_bytes"]}
        for mode in ("gpu", "offload"):
            o, t = results["runs"].get(f"ours_{shape_name}_{mode}", {}), results["runs"].get(f"torch_{shape_name}_{mode}", {})
            if o.get("tokens_per_s") and t.get("tokens_per_s"):
                results["runs"][f"ratio_{shape_name}_{mode}"] = {"tokens_per_s": o["tokens_per_s"] / t["tokens_per_s"]}
    results["tests"] = read_figures(args.figures)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    log(f"wrote {args.out}")


def debugger_backtrace(argv, env, timeout):
    """The stacks at a crash: `argv` run under cuda-gdb (or gdb) in batch mode; '' without one."""
    dbg = shutil.which("cuda-gdb") or shutil.which("gdb")
    if not dbg or timeout < 10:
        return ""
    cmd = [dbg, "-batch", "-ex", "run", "-ex", "bt 40", "-ex", "thread apply all bt 12", "--args"] + list(argv)
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=int(timeout))
        return f"[{Path(dbg).name}, rc {p.returncode}]\n" + (p.stdout + p.stderr)[-12000:]
    except subprocess.TimeoutExpired:
        return f"[{Path(dbg).name}] timed out after {int(timeout)} s"


def read_figures(path):
    """The `[gpu-figures] {...}` lines the gpu-labelled tests print (ctest log), merged."""
    figures = {}
    if path and Path(path).exists():
        for line in Path(path).read_text(errors="replace").splitlines():
            at = line.find("[gpu-figures] ")
            if at >= 0:
                try:
                    figures.update(json.loads(line[at + len("[gpu-figures] "):]))
                except json.JSONDecodeError:
                    figures.setdefault("unparsed", []).append(line[at:])
    return figures


def plan(args):
    for shape_name in args.shapes.split(","):
        log(f"shape {shape_name}: {num_params(SHAPES[shape_name]) / 1e9:.2f}B parameters, "
            f"{flops_per_token(SHAPES[shape_name]) / 1e9:.1f} GFLOP/token at seq {SEQ}")
        for run_name, _, argv in commands(args, shape_name, Path(args.work)):
            print(f"  would run [{run_name}]: {' '.join(argv)}")
            if run_name.startswith("init_"):
                print(f"  would copy {Path(args.data) / 'tokenizer.model'} into {Path(args.work) / f'model_{shape_name}'}")


# SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV: a run these end is worth its backtrace.
CRASH_SIGNALS = {int(signal.SIGILL), int(signal.SIGABRT), int(signal.SIGBUS), int(signal.SIGFPE), int(signal.SIGSEGV)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", required=True)
    p.add_argument("--shared", required=True)
    for name in ("run", "plan"):
        r = sub.add_parser(name)
        r.add_argument("--bin", required=True)
        r.add_argument("--data", required=True)
        r.add_argument("--work", default="/tmp/alpaca_gpu_bench")
        r.add_argument("--out", default="gpu_check.json")
        r.add_argument("--shapes", default="1b,7b")
        r.add_argument("--steps", type=int, default=4)
        r.add_argument("--batch_1b", type=int, default=4)
        r.add_argument("--batch_7b", type=int, default=2)
        r.add_argument("--budget_s", type=int, default=300)
        r.add_argument("--comm_shape", default="1b", help="shape of the forced-collective and estimate-memory runs")
        r.add_argument("--figures", default="", help="JSON lines of figures from the gpu tests, merged into --out")
    args = ap.parse_args()
    {"prepare": prepare, "run": run, "plan": plan}[args.cmd](args)


if __name__ == "__main__":
    main()
