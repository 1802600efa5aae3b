"""The memory planner against measurement on CPU (issue 17): for each model size, world size and
OOM-ladder rung (full_shard; + offload; + gradient_checkpointing; LoRA r=16; LoRA + offload, and a
few other --use_peft and QLoRA configurations, see RUNGS), `alpaca-train estimate-memory
--num_cpu_ranks N --json` (device_allocated_bytes) beside the peak live CPU tensor bytes the
counting allocator measured during training (max over ranks and log lines of metrics.jsonl's
cpu_tensor_peak_bytes). Every sequence is model_max_length tokens (bench.py's data), the case the
planner assumes. Writes a markdown table (and JSON) to --out; exits 1 if any error exceeds --tol.

  python bench/memory_validate.py --sizes tiny,small --ranks 1,2,4 --out /tmp/memval
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402

CKPT = ["--gradient_checkpointing", "True"]
LORA = ["--use_peft", "True", "--lora_r", "16"]  # peft's LLaMA default targets q_proj v_proj, dropout 0.05
RUNGS = {
    "full_shard": ("full_shard auto_wrap", []),
    "+offload": ("full_shard auto_wrap offload", []),
    "+offload+ckpt": ("full_shard auto_wrap offload", CKPT),
    # The ladder's LoRA rungs (r=16, with checkpointing; + offload), and LoRA without checkpointing.
    "lora": ("full_shard auto_wrap", LORA),
    "lora+ckpt": ("full_shard auto_wrap", LORA + CKPT),
    "lora+offload+ckpt": ("full_shard auto_wrap offload", LORA + CKPT),
    # A given --use_peft configuration other than the rungs': every linear, no dropout, lm_head trained.
    "lora-all-linear": ("full_shard auto_wrap", LORA + ["--lora_target_modules", "all-linear", "--lora_dropout", "0"]),
    "lora+lm_head": ("full_shard auto_wrap", LORA + ["--lora_modules_to_save", "lm_head"]),
    # QLoRA (issue 29): the ladder's qlora rung (nf4, nested, checkpointing), and fp4 on every linear.
    "qlora+ckpt": ("full_shard auto_wrap", LORA + CKPT + ["--load_in_4bit", "True", "--use_bnb_nested_quant", "True"]),
    "qlora-fp4-all-linear": ("full_shard auto_wrap", LORA + ["--lora_target_modules", "all-linear", "--load_in_4bit",
                                                             "True", "--bnb_4bit_quant_type", "fp4"]),
}
DEFAULT_RUNGS = "full_shard,+offload,+offload+ckpt,lora,lora+offload+ckpt"


def flags(model_dir, data_json, out_dir, batch, seq_len, fsdp, extra, dtype):
    f = ["--model_name_or_path", str(model_dir), "--data_path", str(data_json), "--output_dir", str(out_dir),
         "--max_steps", "2", "--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", "1",
         "--model_max_length", str(seq_len), "--learning_rate", "1e-5", "--lr_scheduler_type", "constant",
         "--logging_steps", "1", "--save_strategy", "no", "--report_to", "jsonl", "--disable_tqdm", "True",
         "--log_level", "warning", "--fsdp", fsdp] + extra
    return f + (["--bf16", "True"] if dtype == "bf16" else [])


def env():
    return dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_btl_vader_single_copy_mechanism="none")


def measure(case, model_dir, data_json, work, timeout):
    out_dir = Path(tempfile.mkdtemp(dir=work))
    cmd = ["mpirun", "-np", str(case["ranks"]), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-x", "OMP_NUM_THREADS", str(bench.train_bin())] + flags(model_dir, data_json, out_dir, case["batch"],
                                                                   case["seq_len"], case["fsdp"], case["extra"],
                                                                   case["dtype"])
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
    metrics = out_dir / "metrics.jsonl"
    if p.returncode != 0 or not metrics.exists():
        raise RuntimeError(f"training failed ({p.returncode}): {(p.stdout + p.stderr)[-1500:]}")
    peaks = [json.loads(l).get("cpu_tensor_peak_bytes") for l in metrics.read_text().splitlines()]
    shutil.rmtree(out_dir, ignore_errors=True)
    return max(v for v in peaks if v is not None)


def estimate(case, model_dir, data_json):
    cmd = [str(bench.train_bin()), "estimate-memory", "--num_cpu_ranks", str(case["ranks"]), "--json"] + \
        flags(model_dir, data_json, "/nonexistent", case["batch"], case["seq_len"], case["fsdp"], case["extra"],
              case["dtype"])
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--rungs", default=DEFAULT_RUNGS, help="any of: " + ", ".join(RUNGS))
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--tol", type=float, default=0.15)
    ap.add_argument("--out", default="/tmp/alpaca_memory_validate")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--reuse_measured", action="store_true",
                    help="take a case's measured peak from --out's measured.json when an earlier run has it (to "
                         "re-estimate after a planner change without training again)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache_file = out / "measured.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    tok = bench.shared_dir() / "llama2-tokenizer" / "tokenizer.model"
    alpaca = bench.shared_dir() / "alpaca" / "alpaca_5000.json"
    if not tok.exists() or not alpaca.exists():
        print(f"[memory] skipped: shared data not found under {bench.shared_dir()}")
        return 0
    data_json, _ = bench.make_data(out, alpaca, tok, args.seq_len, 64)
    rows, worst = [], 0.0
    for size in args.sizes.split(","):
        model_dir = bench.make_model(size, out, tok)
        for dtype in args.dtypes.split(","):
            for ranks in [int(r) for r in args.ranks.split(",")]:
                for rung in args.rungs.split(","):
                    fsdp, extra = RUNGS[rung]
                    case = dict(size=size, dtype=dtype, ranks=ranks, rung=rung, fsdp=fsdp, extra=extra,
                                batch=args.batch, seq_len=args.seq_len)
                    est = estimate(case, model_dir, data_json)
                    key = f"{size}|{dtype}|{ranks}|{rung}|{args.batch}|{args.seq_len}"
                    if args.reuse_measured and key in cache:
                        measured = cache[key]
                    else:
                        measured = measure(case, model_dir, data_json, out, args.timeout)
                        cache[key] = measured
                        cache_file.write_text(json.dumps(cache, indent=1))
                    predicted = est["device_allocated_bytes"]
                    err = predicted / measured - 1.0
                    worst = max(worst, abs(err))
                    row = dict(size=size, dtype=dtype, ranks=ranks, rung=rung, batch=args.batch, seq_len=args.seq_len,
                               estimate_bytes=predicted, measured_bytes=measured, error=err,
                               peak_moment=est["peak_moment"],
                               deepspeed_gpu_bytes=est["deepspeed_zero3_estimate"]["gpu_bytes_per_gpu"])
                    rows.append(row)
                    print(f"[memory] {size} {dtype} world {ranks} {rung}: estimate {predicted / 2**20:.1f} MiB, "
                          f"measured {measured / 2**20:.1f} MiB ({err * 100:+.1f}%), peak at {row['peak_moment']}",
                          flush=True)
    lines = ["| model | dtype | world | rung | micro-batch x seq | estimate MiB | measured MiB | error | peak at | "
             "DeepSpeed formula MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['dtype']} | {r['ranks']} | {r['rung']} | {r['batch']} x {r['seq_len']} | "
                     f"{r['estimate_bytes'] / 2**20:.1f} | {r['measured_bytes'] / 2**20:.1f} | {r['error'] * 100:+.1f}% | "
                     f"{r['peak_moment']} | {r['deepspeed_gpu_bytes'] / 2**20:.1f} |")
    (out / "memory_validate.md").write_text("\n".join(lines) + "\n")
    (out / "memory_validate.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    print(f"[memory] worst error {worst * 100:.1f}% (tolerance {args.tol * 100:.0f}%)")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
