"""Two alpaca-train binaries on one bench.py case, alternating, for an engine change's before/after.

    python bench/ab_ours.py --bins /tmp/old/alpaca-train,build/alpaca-train --qlora --ranks 2 --fsdp full_shard

Same model, data and flags as bench.py (bench.run_ours); prints each run's median step time (warm-up
excluded), the load average, and the median over repetitions per binary.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bins", required=True, help="comma-separated alpaca-train binaries")
    ap.add_argument("--ranks", type=int, default=2)
    bench.add_case_flags(ap, seq_len=256, steps=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    bins = args.bins.split(",")
    for b in bins:
        if not Path(b).exists():
            bench.log(f"{b}: no such binary")
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = bench.shared_dir() / "llama2-tokenizer" / "tokenizer.model"
    data_json, _ = bench.make_data(out, bench.shared_dir() / "alpaca" / "alpaca_5000.json", tok, args.seq_len, 256)
    model_dir = bench.make_model(args.size, out, tok)
    per_rank = max(args.global_batch // args.ranks, 1)
    batch = min(args.batch, per_rank)
    case = dict(name=f"{args.size}_{args.ranks}r_{args.dtype}_{args.fsdp}", size=args.size, ranks=args.ranks,
                dtype=args.dtype, batch=batch, accum=max(per_rank // batch, 1), steps=args.steps, seq_len=args.seq_len,
                threads=1, lora_r=16 if args.qlora else 0, load_in_4bit=args.qlora, fsdp=args.fsdp)
    bench.log(f"CPU: {bench.cpu_model()}, {os.cpu_count()} CPUs; case {case['name']}")
    medians = {b: [] for b in bins}
    for rep in range(args.reps):
        for b in bins:
            os.environ["ALPACA_TRAIN_BIN"] = b
            t0 = time.time()
            r = bench.run_ours(case, model_dir, data_json, out, 3600)
            if "error" in r:
                bench.log(f"{b}: {r['error']}")
                return 1
            med = statistics.median(r["step_times"][args.warmup:])
            medians[b].append(med)
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            bench.log(f"rep {rep} {b}: median step {med:.3f} s ({time.time() - t0:.0f} s wall, load {load})")
    tokens = args.global_batch * args.seq_len
    for b in bins:
        m = statistics.median(medians[b])
        bench.log(f"{b}: median of {len(medians[b])} reps {m:.3f} s/step = {tokens / m:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
