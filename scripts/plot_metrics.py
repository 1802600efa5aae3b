#!/usr/bin/env python3
"""Plot a training run's metrics.jsonl (written by --report_to jsonl or all) as one PNG.

    .venv/bin/python scripts/plot_metrics.py OUTPUT_DIR [--out PNG]

Six panels against the optimizer step: training loss (eval loss overlaid), eval loss, learning
rate, gradient norm, tokens/s, and memory (host RSS and its peak; GPU allocated/reserved when the
run was on a GPU). OUTPUT_DIR is the run's --output_dir (or --logging_dir when that was given), or
the metrics.jsonl file itself. The PNG goes to OUTPUT_DIR/metrics.png unless --out says otherwise;
its path is printed. matplotlib (Agg backend, no display) is a tool dependency, not needed to train.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path):
    """(train logs, eval logs) keyed by step; a resumed run appends, so a later line for a step wins."""
    train, evals = {}, {}
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except json.JSONDecodeError as err:
            if n == len(lines):
                break  # a run killed mid-line leaves a torn last line; everything before it counts
            raise SystemExit(f"{path}:{n} is not JSON ({err}); is this a metrics.jsonl written by alpaca-train?")
        if "step" not in e:
            continue
        if "loss" in e:
            train[e["step"]] = e
        elif "eval_loss" in e:
            evals[e["step"]] = e
    return dict(sorted(train.items())), dict(sorted(evals.items()))


def series(logs, key, scale=1.0):
    xs, ys = [], []
    for step, e in logs.items():
        v = e.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(step)
            ys.append(v * scale)
    return xs, ys


def memory_unit(logs):
    peak = max((v for e in logs.values() for k, v in e.items() if k.endswith("_bytes") and isinstance(v, (int, float))),
               default=0)
    return ("GiB", 2.0**-30) if peak >= 2 * 2**30 else ("MiB", 2.0**-20)


def plot(train, evals, title, out):
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    fig.suptitle(title)
    (ax_loss, ax_eval, ax_lr), (ax_gn, ax_tps, ax_mem) = axes

    def line(ax, logs, key, label, scale=1.0, **kw):
        xs, ys = series(logs, key, scale)
        if xs:
            ax.plot(xs, ys, label=label, **kw)
        return bool(xs)

    def finish(ax, name, ylabel, drew, legend=False):
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if not drew:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        elif legend:
            ax.legend(fontsize="small")

    drew = line(ax_loss, train, "loss", "train loss", marker="." if len(train) < 50 else None)
    drew |= line(ax_loss, evals, "eval_loss", "eval loss", marker="o", linestyle="--")
    finish(ax_loss, "loss", "loss", drew, legend=True)
    finish(ax_eval, "eval loss", "eval loss", line(ax_eval, evals, "eval_loss", "eval loss", marker="o", color="C1"))
    finish(ax_lr, "learning rate", "learning rate", line(ax_lr, train, "learning_rate", "lr", color="C2"))
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    finish(ax_gn, "grad norm", "grad norm (before clipping)", line(ax_gn, train, "grad_norm", "grad norm", color="C3"))
    drew = line(ax_tps, train, "tokens_per_second", "all ranks", color="C4")
    drew |= line(ax_tps, train, "tokens_per_second_per_rank", "per rank (rank 0)", color="C4", linestyle=":")
    finish(ax_tps, "throughput", "tokens/s", drew, legend=True)
    unit, scale = memory_unit(train)
    drew = False
    for key, label in (("host_rss_bytes", "host RSS"), ("host_peak_rss_bytes", "host peak RSS"),
                       ("gpu_allocated_bytes", "GPU allocated"), ("gpu_peak_allocated_bytes", "GPU peak allocated"),
                       ("gpu_reserved_bytes", "GPU reserved")):
        drew |= line(ax_mem, train, key, label, scale)
    finish(ax_mem, "memory (rank 0)", unit, drew, legend=True)
    if drew:  # from zero: a few MiB of growth should not look like a jump
        ax_mem.set_ylim(0, ax_mem.get_ylim()[1] * 1.25)
        ax_mem.legend(fontsize="small", loc="lower right")
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir", help="the run's --output_dir (or --logging_dir), or its metrics.jsonl")
    ap.add_argument("--out", help="PNG to write (default: OUTPUT_DIR/metrics.png)")
    args = ap.parse_args()
    src = Path(args.output_dir)
    path = src if src.is_file() else src / "metrics.jsonl"
    if not path.is_file():
        sys.exit(f"plot_metrics: {path} not found; train with --report_to jsonl (or all) to write it, "
                 f"or pass the --logging_dir the run used")
    train, evals = read_metrics(path)
    if not train and not evals:
        sys.exit(f"plot_metrics: {path} holds no training or eval logs yet (logged every --logging_steps steps)")
    out = Path(args.out) if args.out else path.parent / "metrics.png"
    last = train[max(train)] if train else evals[max(evals)]
    title = f"{path.parent}: {len(train)} training logs, {len(evals)} evals, last step {max(list(train) + list(evals))}"
    if "epoch" in last:
        title += f" (epoch {last['epoch']:.2f})"
    plot(train, evals, title, out)
    print(out)


if __name__ == "__main__":
    main()
