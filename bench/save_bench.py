"""Checkpoint save benchmark (issue 30): the gathered layout (rank 0 writes everything, the only
one before) vs sharded (every rank writes its shards), synchronous and --save_async, side by side.

  .venv/bin/python bench/save_bench.py --size small --ranks 4     # ~106M LLaMA, 4 ranks
  .venv/bin/python bench/save_bench.py --size tiny --ranks 2      # quick

Each case trains 6 steps and saves at step 3 (in the middle of training, so an async save runs
beside steps 4-5) and at step 6 (the last step: always synchronous). Reported for the step-3
save, from the trainer's own log line and metrics.jsonl:
  - save wall time (rank 0's view: until the checkpoint is sealed),
  - the training stall: step 4's time (its window includes the step-3 save) / the median of the
    other steps' times,
  - bytes written per rank, and what the save added to each rank's peak RSS (rank 0 vs the others).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = False
sys.path.insert(0, str(HERE))
import bench  # noqa: E402  (make_model, make_data, shared_dir)

CASES = [("gathered", "--save_checkpoint_layout gathered"),
         ("sharded sync", "--save_checkpoint_layout sharded --save_async False"),
         ("sharded async", "--save_checkpoint_layout sharded --save_async True")]
LINE = re.compile(r"saved checkpoint (\S+?)(?: \((\w+)\))?: shard bytes per rank \[([0-9, ]+)\] of (\d+) .*?"
                  r"RSS growth during the save: rank 0 (\d+) MiB, other ranks at most (\d+) MiB; training stalled "
                  r"([0-9.e-]+) s, the shard write took ([0-9.e-]+) s")


def run_case(name, extra, model, data, work, ranks, seq):
    out = work / name.replace(" ", "_")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    cmd = (f"mpirun -np {ranks} --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "
           f"{bench.train_bin()} --model_name_or_path {model} --data_path {data} --output_dir {out} --max_steps 6 "
           f"--save_steps 3 --logging_steps 1 --report_to jsonl --per_device_train_batch_size 1 "
           f"--model_max_length {seq} --learning_rate 1e-4 --fsdp 'full_shard auto_wrap' {extra}")
    t0 = time.time()
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{name} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    log = p.stdout + p.stderr
    saves = [m for m in LINE.finditer(log) if m.group(1).endswith("checkpoint-3")]
    if not saves:
        raise SystemExit(f"{name}: no save line for checkpoint-3 in the log:\n{log[-3000:]}")
    m = saves[-1]
    steps = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        e = json.loads(line)
        if "step_time" in e:
            steps[int(e["step"])] = e["step_time"]
    normal = statistics.median(steps[s] for s in (2, 3, 5) if s in steps)
    if not KEEP:  # a 106M case writes ~3 GB (two checkpoints + the export): free it for the next case
        subprocess.run(["rm", "-rf", str(out)], check=True)
    return dict(case=name, bytes_per_rank=[int(x) for x in m.group(3).split(",")], total=int(m.group(4)),
                rss0=int(m.group(5)), rss_others=int(m.group(6)), stall=float(m.group(7)), write=float(m.group(8)),
                step4=steps.get(4), normal=normal, run_s=time.time() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small", choices=sorted(bench.MODELS))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--work", default=str(HERE.parent / "build" / "save_bench"))
    ap.add_argument("--keep", action="store_true", help="keep each case's output_dir (default: removed once measured)")
    a = ap.parse_args()
    global KEEP
    KEEP = a.keep
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    tok = bench.shared_dir() / "llama2-tokenizer" / "tokenizer.model"
    model = bench.make_model(a.size, work, tok)
    data, _ = bench.make_data(work, bench.shared_dir() / "alpaca" / "alpaca_5000.json", tok, a.seq, 64)
    rows = [run_case(n, e, model, data, work, a.ranks, a.seq) for n, e in CASES]
    print(f"\n{a.size} model, {a.ranks} ranks, save of checkpoint-3 (fp32 weights + 2 AdamW moments); "
          f"CPU {bench.cpu_model()}, load average {os.getloadavg()[0]:.1f} at the end:\n")
    print("| layout | save wall s (rank 0) | training stalled s | step 4 / normal step | bytes per rank (MB) | "
          "rank 0 RSS growth MiB | others' RSS growth MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["step4"] / r["normal"] if r["step4"] and r["normal"] else float("nan")
        wall = r["stall"] + (r["write"] if r["case"] == "sharded async" else 0)  # sync: the stall is the save
        print(f"| {r['case']} | {wall:.2f} | {r['stall']:.2f} | "
              f"{ratio:.2f} ({r['step4']:.2f} / {r['normal']:.2f} s) | "
              f"{', '.join(f'{b / 1e6:.1f}' for b in r['bytes_per_rank'])} | {r['rss0']} | {r['rss_others']} |")
    (work / "save_bench.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
