#!/usr/bin/env python3
"""transformers side of the load benchmark: from_pretrained time and peak RSS (VmHWM)."""
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def peak_rss_gib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def main():
    path, dtype_name = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "float32"
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    before = peak_rss_gib()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    secs = time.perf_counter() - t0
    params = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(f"transformers load {dtype_name:<8} {secs:6.2f} s  peak RSS {peak_rss_gib():5.2f} GiB "
          f"(before {before:4.2f} GiB, params {params:4.2f} GiB)")


if __name__ == "__main__":
    main()
