"""Checkpoint save benchmark (issue 30): the gathered layout (rank 0 writes everything, the only
one before) vs sharded (every rank writes its shards), synchronous and --save_async, side by side.

  .venv/bin/python bench/save_bench.py --size small --ranks 4     # ~106M LLaMA, 4 ranks
  .venv/bin/python bench/save_bench.py --size tiny --ranks 2      # quick

  .venv/bin/python bench/save_bench.py --size medium --steps 8 --before /tmp/old/alpaca-train \
      --cases "sharded async" --repeat 2   # this build's async save vs an older binary's, alternating

Each case trains --steps steps (6) and saves at the middle step S (so an async save runs beside
the steps after it) and at the last (always synchronous). Reported for the step-S save, from the
trainer's own log line and metrics.jsonl:
  - save wall time (rank 0's view: until the checkpoint is sealed),
  - the training stall: step S+1's time (its window includes the step-S save) / a normal step (the
    median of steps 2..S, before the save),
  - the mean step time over the steps the background write overlaps (steps S+1.. that started
    before the write ended) / a normal step, the write's end-to-end time and its thread's CPU time,
  - minor page faults (metrics.jsonl host_minor_faults: the most of any rank, all threads) of step
    S+1 and of a normal step: unlike the times they do not depend on the machine's load,
  - bytes written per rank, and what the save added to each rank's peak RSS (rank 0 vs the others);
    with a build that prints them, each rank's RSS at the save's start, the growth during it and
    the peak.
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
                  r"([0-9.e-]+) s, the shard write took ([0-9.e-]+) s"
                  r"(?: \(sealed at step (\d+) .*?RSS MiB per rank \(.*?\):([^;]*); writer thread CPU s per rank: (.*))?")
RSS_RANK = re.compile(r"rank (\d+) (\d+)/(\d+)/(\d+)/(\d+)")


def run_case(name, extra, model, data, work, ranks, seq, steps, binary):
    out = work / name.replace(" ", "_").replace("(", "").replace(")", "")
    subprocess.run(["rm", "-rf", str(out)], check=True)
    save = steps // 2
    cmd = (f"mpirun -np {ranks} --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 "
           f"{binary} --model_name_or_path {model} --data_path {data} --output_dir {out} --max_steps {steps} "
           f"--save_steps {save} --logging_steps 1 --report_to jsonl --per_device_train_batch_size 1 "
           f"--model_max_length {seq} --learning_rate 1e-4 --fsdp 'full_shard auto_wrap' {extra}")
    t0 = time.time()
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{name} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    log = p.stdout + p.stderr
    saves = [m for m in LINE.finditer(log) if m.group(1).endswith(f"checkpoint-{save}")]
    if not saves:
        raise SystemExit(f"{name}: no save line for checkpoint-{save} in the log:\n{log[-3000:]}")
    m = saves[-1]
    steps_t, faults = {}, {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        e = json.loads(line)
        if "step_time" in e:
            steps_t[int(e["step"])] = e["step_time"]
            if "host_minor_faults" in e:  # builds before it have no fault counts
                faults[int(e["step"])] = e["host_minor_faults"]
    if not KEEP:  # a 106M case writes ~3 GB (two checkpoints + the export): free it for the next case
        subprocess.run(["rm", "-rf", str(out)], check=True)
    stall, write = float(m.group(7)), float(m.group(8))
    # The steps the background write overlaps: those after the save that started before it ended.
    overlap, t = [], 0.0
    for s in range(save + 1, steps + 1):
        if s not in steps_t or (overlap and t >= stall + write):
            break
        overlap.append(steps_t[s])
        t += steps_t[s]
    rss = {int(r[0]): [int(x) for x in r[1:]] for r in RSS_RANK.findall(m.group(10) or "")}
    return dict(case=name, bytes_per_rank=[int(x) for x in m.group(3).split(",")], total=int(m.group(4)),
                rss0=int(m.group(5)), rss_others=int(m.group(6)), stall=stall, write=write,
                sealed_step=int(m.group(9)) if m.group(9) else None, rss_per_rank=rss,
                writer_cpu=[float(x) for x in m.group(11).split(",")] if m.group(11) else None,
                step_after=steps_t.get(save + 1), overlap=overlap, save_step=save,
                faults_after=faults.get(save + 1), step_times=steps_t, step_faults=faults,
                faults_normal=statistics.median(faults[s] for s in range(2, save + 1) if s in faults) if faults else None,
                normal=statistics.median(steps_t[s] for s in range(2, save + 1) if s in steps_t), run_s=time.time() - t0)


def fmt_faults(r):
    if r.get("faults_after") is None:
        return "-"
    return f"{r['faults_after'] / 1000:.1f}k / {r['faults_normal'] / 1000:.1f}k"


def print_tables(rows):
    s = rows[0]["save_step"]
    print(f"| layout | save wall s (rank 0) | training stalled s | step {s + 1} / normal step | mean of the steps "
          f"beside the write / normal | minor faults step {s + 1} / normal | write end to end s | writer CPU s (max rank) | "
          f"bytes per rank (MB) | rank 0 RSS growth MiB | others' RSS growth MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["step_after"] / r["normal"] if r["step_after"] and r["normal"] else float("nan")
        mean = statistics.mean(r["overlap"]) if r["overlap"] else float("nan")
        wall = r["stall"] + (r["write"] if "async" in r["case"] else 0)  # sync: the stall is the save
        cpu = f"{max(r['writer_cpu']):.2f}" if r["writer_cpu"] else "-"
        print(f"| {r['case']} | {wall:.2f} | {r['stall']:.2f} | {ratio:.2f} ({r['step_after']:.2f} / {r['normal']:.2f} s) | "
              f"{mean / r['normal']:.2f} (n={len(r['overlap'])}, {mean:.2f} s) | {fmt_faults(r)} | {r['write']:.2f} | {cpu} | "
              f"{', '.join(f'{b / 1e6:.1f}' for b in r['bytes_per_rank'])} | {r['rss0']} | {r['rss_others']} |")
    if any(r["rss_per_rank"] for r in rows):
        print("\nRSS MiB per rank: at the save's start (the process peak before it) + what the save window added = "
              "the peak during the save\n")
        for r in rows:
            if r["rss_per_rank"]:
                print(f"- {r['case']}: " + ", ".join(
                    f"rank {k} {v[1]} ({v[0]}) +{v[3] - v[1]} = {v[3]}" for k, v in sorted(r["rss_per_rank"].items())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="small", choices=sorted(bench.MODELS))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6, help="steps to train; the measured save is at steps // 2")
    ap.add_argument("--cases", default=",".join(n for n, _ in CASES), help="comma-separated case names to run")
    ap.add_argument("--before", help="an older alpaca-train binary: every case also runs with it, alternating")
    ap.add_argument("--repeat", type=int, default=1)
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
    wanted = [c.strip() for c in a.cases.split(",")]
    bins = [("", bench.train_bin())] + ([(" (before)", Path(a.before))] if a.before else [])
    rows = []
    print(f"CPU {bench.cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    for rep in range(a.repeat):
        for n, e in CASES:
            if n not in wanted:
                continue
            for tag, b in (bins if rep % 2 == 0 else bins[::-1]):
                rows.append(run_case(n + tag, e, model, data, work, a.ranks, a.seq, a.steps, b))
                print(f"[{rows[-1]['case']}] done in {rows[-1]['run_s']:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\n{a.size} model, {a.ranks} ranks, {a.steps} steps, save of checkpoint-{a.steps // 2} (fp32 weights + 2 AdamW "
          f"moments); CPU {bench.cpu_model()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end:\n")
    print_tables(rows)
    (work / "save_bench.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
