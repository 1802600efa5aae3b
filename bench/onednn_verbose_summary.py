"""Sum oneDNN's per-primitive execution times from a log written with ONEDNN_VERBOSE=1.

Used to compare which GEMMs each side of bench/bench.py runs (docs/lora.md, "Profile"): run one
side with ONEDNN_VERBOSE=1, keep its stdout/stderr, and print the primitives grouped by kind,
implementation, problem shape and weight layout, most expensive first. A `reorder` line in the
output would mean oneDNN repacks an operand per call.

  ONEDNN_VERBOSE=1 mpirun -np 1 build/alpaca-train ... > ours.log 2>&1
  python bench/onednn_verbose_summary.py ours.log [--top 25]
"""
import argparse
import collections


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    agg = collections.defaultdict(lambda: [0, 0.0])
    by_kind = collections.defaultdict(float)
    total = 0.0
    with open(args.log, errors="replace") as f:
        for line in f:
            # onednn_verbose,v1,primitive,exec,cpu,<kind>,<impl>,<prop>,<mds>,<attrs>,<aux>,<shape>,<ms>
            fields = line.strip().split(",")
            if len(fields) < 13 or fields[2] != "primitive" or fields[3] != "exec":
                continue
            kind, impl, mds, shape = fields[5], fields[6], fields[8], fields[-2]
            try:
                ms = float(fields[-1])
            except ValueError:
                continue
            wei = next((m for m in mds.split() if m.startswith("wei:")), mds[:40])
            key = (kind, impl, shape, wei)
            agg[key][0] += 1
            agg[key][1] += ms
            by_kind[kind] += ms
            total += ms
    print(f"oneDNN exec total {total:.0f} ms; by kind: " +
          ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    for (kind, impl, shape, wei), (n, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{ms:8.0f} ms {100 * ms / max(total, 1e-9):5.1f}%  n={n:5d}  {kind:8s} {impl:28s} {shape:22s} {wei}")


if __name__ == "__main__":
    main()
