"""Where a training step's time goes, ours and PyTorch's side by side (issue 32, docs/profile_bf16.md).

Runs bench.py's case (same random model, data, global batch, threads) once per side:
- ours: build/tests/train/bench_train_profile (or $ALPACA_PROFILE_BIN; alpaca-train under a RecordFunction observer,
  bench/train_profile.cpp), per-step averages over the steps after --skip, thread CPU and wall time;
- PyTorch: bench/torch_fsdp_train.py --profile (transformers + FSDP2, torch.profiler on the last
  step, the phases' thread CPU time over the steps before it), bench/torch_step_profile.py.
Both split the step the same way: phase (forward, backward, optimizer, ...) x kind (gemm, attention,
rmsnorm, rope, silu_mul, residual, loss, embedding, FSDP collectives and casts, other ops, host code).

  python bench/profile_step.py --size small --ranks 1,2 --dtype bf16 --steps 4
"""
import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402

ROOT = HERE.parent


def run_side(side: str, case: dict, model_dir: Path, data_json: Path, data_pt: Path, work: Path, skip: int) -> dict:
    pdir = work / f"prof_{side}_{case['name']}_{time.time_ns()}"
    pdir.mkdir(parents=True)
    if side == "ours":
        os.environ["ALPACA_TRAIN_BIN"] = os.environ.get("ALPACA_PROFILE_BIN",
                                                        str(ROOT / "build" / "tests" / "train" / "bench_train_profile"))
        os.environ["ALPACA_PROFILE_OUT"] = str(pdir)
        os.environ["ALPACA_PROFILE_SKIP"] = str(skip)
        r = bench.run_ours(case, model_dir, data_json, work, 3600)
        for k in ("ALPACA_TRAIN_BIN", "ALPACA_PROFILE_OUT", "ALPACA_PROFILE_SKIP"):
            os.environ.pop(k)
        files = sorted(pdir.glob("rank*.json"))
    else:
        case = dict(case, torch_args=["--profile", str(pdir), "--profile_skip", str(skip)])
        r = bench.run_torch(case, model_dir, data_pt, work, 3600)
        files = sorted(pdir.glob("torch_rank*.json"))
    if "error" in r or not files:
        raise SystemExit(f"{side} {case['name']} failed: {r.get('error', 'no profile written')}")
    prof = json.loads(files[0].read_text())  # rank 0
    prof["run"] = {k: r[k] for k in ("step_times", "peak_rss_bytes_per_rank") if k in r}
    shutil.rmtree(pdir, ignore_errors=True)
    return prof


def kinds_table(ours: dict, theirs: dict, phases=("forward", "backward", "optimizer")) -> list:
    def agg(p, key):
        out = {}
        for e in p.get("by_kind", []):
            if e["phase"] in phases and key in e:
                out[e["kind"]] = out.get(e["kind"], 0.0) + e[key]
        return out

    oc, ow, tw = agg(ours, "cpu_s"), agg(ours, "wall_s"), agg(theirs, "wall_s")
    ob, tb = agg(ours, "bytes"), agg(theirs, "bytes")
    rows = sorted(set(oc) | set(tw), key=lambda k: -(oc.get(k, 0) + tw.get(k, 0)))
    lines = ["| kind (forward + backward + optimizer) | ours CPU s | ours wall s | PyTorch wall s (profiled step) "
             "| ours operand GB | PyTorch operand GB |",
             "|---|---:|---:|---:|---:|---:|"]
    gb = lambda v: f"{v / 1e9:.2f}"
    for k in rows:
        lines.append(f"| {k} | {oc.get(k, 0):.3f} | {ow.get(k, 0):.3f} | {tw.get(k, 0):.3f} | {gb(ob.get(k, 0))} "
                     f"| {gb(tb.get(k, 0))} |")
    lines.append(f"| **sum** | {sum(oc.values()):.3f} | {sum(ow.values()):.3f} | {sum(tw.values()):.3f} "
                 f"| {gb(sum(ob.values()))} | {gb(sum(tb.values()))} |")
    lines += ["", "Operand GB: bytes moved, estimated as every leaf op's tensor inputs (in-place and out= "
              "destinations included, fresh outputs and views not; our own kernels report theirs); per step, "
              "rank 0. The \"other threads\" phase (ours) is not in these sums."]
    return lines


def phase_kind_table(p: dict, key: str, title: str) -> list:
    phases = sorted({e["phase"] for e in p.get("by_kind", [])})
    kinds = {}
    for e in p.get("by_kind", []):
        kinds.setdefault(e["kind"], {})[e["phase"]] = e.get(key, 0.0)
    lines = [f"| {title} | " + " | ".join(phases) + " |", "|---|" + "---:|" * len(phases)]
    for k, v in sorted(kinds.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(f"| {k} | " + " | ".join(f"{v.get(ph, 0):.3f}" for ph in phases) + " |")
    return lines


def top_ops(p: dict, key: str, n: int) -> list:
    ops = sorted(p.get("by_op", []), key=lambda e: -e.get(key, 0))[:n]
    lines = [f"| kind | op | {key} | calls/step |", "|---|---|---:|---:|"]
    for e in ops:
        lines.append(f"| {e['kind']} | `{e['op']}` | {e[key]:.4f} | {e['calls']:.0f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,2")
    bench.add_case_flags(ap, seq_len=512, steps=4)
    ap.add_argument("--skip", type=int, default=2, help="steps before the profiled ones")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=["ours", "torch"])
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = bench.shared_dir() / "llama2-tokenizer" / "tokenizer.model"
    alpaca = bench.shared_dir() / "alpaca" / "alpaca_5000.json"
    data_json, data_pt = bench.make_data(out, alpaca, tok, args.seq_len, 256)
    model_dir = bench.make_model(args.size, out, tok)
    report = [f"CPU: {bench.cpu_model()}, {os.cpu_count()} CPUs; load average at start "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; {time.strftime('%Y-%m-%d %H:%M:%S')}", ""]
    results = {}
    for ranks in [int(r) for r in args.ranks.split(",")]:
        per_rank = max(args.global_batch // ranks, 1)
        batch = min(args.batch, per_rank)
        case = dict(name=f"{args.size}_{ranks}r_{args.dtype}", size=args.size, ranks=ranks, dtype=args.dtype,
                    batch=batch, accum=max(per_rank // batch, 1), steps=args.steps, seq_len=args.seq_len,
                    threads=args.threads, lora_r=16 if args.qlora else 0, load_in_4bit=args.qlora, fsdp=args.fsdp)
        res = {}
        for side in ("ours", "torch"):
            if args.only and side != args.only:
                continue
            t0 = time.time()
            res[side] = run_side(side, case, model_dir, data_json, data_pt, out, args.skip)
            bench.log(f"{case['name']} {side}: {time.time() - t0:.0f} s")
        results[case["name"]] = res
        o, t = res.get("ours", {}), res.get("torch", {})
        report += [f"## {case['name']}{bench.case_tag(case)} (micro-batch {batch} x {args.seq_len}, accumulation {case['accum']}, "
                   f"{args.threads} thread/rank), rank 0", ""]
        if o:
            report += [f"ours: {o['steps_profiled']} profiled steps, per step: process CPU {o['process_cpu_s_per_step']:.2f} s, "
                       f"wall {o['wall_s_per_step']:.2f} s; step times {[round(x, 2) for x in o['run'].get('step_times', [])]}"]
        if t:
            report += [f"PyTorch: step times {[round(x, 2) for x in t.get('step_times', [])]} (the last one under "
                       "torch.profiler)"]
        report += ["", "| phase | ours CPU s | ours wall s | ours page faults | PyTorch CPU s | PyTorch wall s |",
                   "|---|---:|---:|---:|---:|---:|"]
        for ph in ("step", "batch", "forward", "backward", "optimizer"):
            a = o.get("phases", {}).get(ph, {})
            b = t.get("phases_unprofiled", {}).get(ph, {})
            report.append(f"| {ph} | {a.get('cpu_s', float('nan')):.3f} | {a.get('wall_s', float('nan')):.3f} | "
                          f"{a.get('minflt', 0):.0f} | {b.get('cpu_s', float('nan')):.3f} | {b.get('wall_s', float('nan')):.3f} |")
        report += ["", *kinds_table(o, t), ""]
        if o:
            report += ["ours by phase (CPU s; \"other threads\": the communication threads during the steps, "
                       "\"setup\": outside the steps):", "", *phase_kind_table(o, "cpu_s", "kind"), "",
                       "ours, top ops (CPU s per step, the steps' threads):", "", *top_ops(o, "cpu_s", 20), ""]
        if t:
            report += ["PyTorch by phase (wall s, profiled step):", "", *phase_kind_table(t, "wall_s", "kind"), "",
                       "PyTorch, top ops (wall s, profiled step):", "", *top_ops(t, "wall_s", 20), ""]
        # Written after every case: a later case that fails (or is killed) keeps the earlier ones.
        text = "\n".join(report) + "\n"
        (out / f"profile_{args.size}_{args.dtype}.md").write_text(text)
        (out / f"profile_{args.size}_{args.dtype}.json").write_text(json.dumps(results, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
