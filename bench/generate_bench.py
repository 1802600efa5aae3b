#!/usr/bin/env python3
"""Generation throughput: new tokens per second, ours (bench_generate) vs transformers' generate,
same model, same prompts (tokenized once, by the model's own tokenizer), same number of new
tokens, same intra-op thread count, greedy on both sides, exactly --new_tokens per prompt (no EOS stop,
so both sides count the same tokens; --stop_at_eos to stop), in fp32 and in bf16 (our --bf16 against
transformers with dtype=torch.bfloat16), batch 1 and batch 8, 1 and 2 threads. Prints one line
per case and a table of every ratio side by side; writes --out/generate.json.

  .venv/bin/python bench/generate_bench.py --model models/smollm2-135m-instruct

Fairness: transformers runs under torch.inference_mode with use_cache=True (its DynamicCache),
sdpa attention, the same pad/EOS ids, left padding as ours; each side gets one warm-up
generation per case (ours inside bench_generate, which also reports the thread count it ran
with; the script checks it); the two sides alternate which goes first from case to case, so a
busy machine slows both alike. Wall-time ratio and CPU-time ratio (process CPU seconds per new
token, which time slices lost to other processes on a shared machine do not inflate) are both
printed. Also printed: whether our greedy tokens equal transformers' (fp32: they should — batch 8
is the same kernels in the same order, batch 1 the fused step, whose fp32 sums differ only in
order (~1e-6 relative), which tests/generate holds token-exact; bf16: the share of prompts whose
answer is identical and of tokens before the first difference, since bf16 sums in another order
round differently and greedy decoding diverges from the first flipped token).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from make_data import PROMPT_INPUT, PROMPT_NO_INPUT  # noqa: E402


def transformers_run(model, prompts, batch, new_tokens, eos, pad):
    import torch
    sys.path.insert(0, str(REPO / "tests" / "reference"))
    from generate_reference import left_padded
    n, secs, cpu, gens = 0, 0.0, 0.0, []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            group = prompts[i:i + batch]
            ids, mask = left_padded(group, pad)
            t = ids.shape[1]
            t0, c0 = time.perf_counter(), time.process_time()
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=eos or None, pad_token_id=pad, use_cache=True)
            secs += time.perf_counter() - t0
            cpu += time.process_time() - c0
            for r in range(len(group)):
                new = out[r, t:].tolist()
                k = next((j + 1 for j, x in enumerate(new) if x in eos), len(new))
                gens.append(new[:k])
                n += k
    return n, secs, cpu, gens


def agreement(ours, theirs):
    """(share of prompts with identical answers, share of tokens before the first difference)."""
    same = sum(a == b for a, b in zip(ours, theirs))
    prefix = total = 0
    for a, b in zip(ours, theirs):
        k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix += k
        total += max(len(a), len(b))
    return same / len(ours), prefix / max(total, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--bin", default=str(REPO / "build" / "tests" / "generate" / "bench_generate"))
    ap.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new_tokens", type=int, default=32)
    ap.add_argument("--stop_at_eos", action="store_true",
                    help="stop a row at EOS (default: every prompt gets exactly --new_tokens on both sides)")
    ap.add_argument("--out", default=str(REPO / "build" / "bench"))
    args = ap.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    gcfg = json.loads((Path(args.model) / "generation_config.json").read_text())
    eos = gcfg["eos_token_id"] if isinstance(gcfg["eos_token_id"], list) else [gcfg["eos_token_id"]]
    pad = gcfg.get("pad_token_id", eos[0])
    records = json.loads((REPO / "data" / "synthetic_eval.json").read_text())[:args.prompts]
    prompts = [tok((PROMPT_INPUT if r.get("input") else PROMPT_NO_INPUT).format_map(r))["input_ids"] for r in records]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    pfile = out_dir / "generate_prompts.json"
    if not args.stop_at_eos:
        eos = []  # no stopping: the same number of new tokens on both sides, whatever they are
    pfile.write_text(json.dumps({"prompts": prompts, "eos_token_id": eos, "pad_token_id": pad}))
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{'up to ' if eos else 'exactly '}{args.new_tokens} new tokens each, greedy; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)

    rows = []
    case = 0
    for dtype in args.dtypes.split(","):
        tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=tdtype, attn_implementation="sdpa").eval()
        if not eos:
            model.generation_config.eos_token_id = None  # else generate() falls back to the model's EOS
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            for batch in [int(b) for b in args.batches.split(",")]:
                def ours():
                    cmd = [args.bin, args.model, str(pfile), str(batch), str(args.new_tokens), f"threads={threads}"]
                    if dtype == "bf16":
                        cmd.append("bf16")
                    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
                    res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
                    o = json.loads(res.stdout.strip().splitlines()[-1])
                    assert o["threads"] == threads, f"bench_generate ran with {o['threads']} threads, not {threads}"
                    return o

                def theirs():
                    transformers_run(model, prompts[:1], 1, 4, eos, pad)  # warm-up
                    assert torch.get_num_threads() == threads
                    return transformers_run(model, prompts, batch, args.new_tokens, eos, pad)

                if case % 2 == 0:
                    o = ours()
                    n_hf, s_hf, c_hf, g_hf = theirs()
                else:
                    n_hf, s_hf, c_hf, g_hf = theirs()
                    o = ours()
                case += 1
                same, prefix = agreement(o["generations"], g_hf)
                row = {"dtype": dtype, "batch": batch, "threads": threads, "ours_tokens": o["new_tokens"],
                       "ours_s": o["seconds"], "ours_cpu_s": o["cpu_seconds"], "ours_tok_s": o["tokens_per_s"],
                       "hf_tokens": n_hf, "hf_s": s_hf, "hf_cpu_s": c_hf, "hf_tok_s": n_hf / s_hf,
                       "same_answers": same, "same_token_prefix": prefix, "load": os.getloadavg()[0]}
                row["ratio"] = row["ours_tok_s"] / row["hf_tok_s"]
                row["cpu_ratio"] = (c_hf / n_hf) / (o["cpu_seconds"] / o["new_tokens"])
                rows.append(row)
                print(f"{dtype} batch {batch}, {threads} thread(s): ours {row['ours_tok_s']:.1f} tok/s "
                      f"({o['new_tokens']} tokens, {1e3 * o['cpu_seconds'] / o['new_tokens']:.1f} CPU-ms/token), "
                      f"transformers {row['hf_tok_s']:.1f} tok/s ({n_hf} tokens, {1e3 * c_hf / n_hf:.1f} CPU-ms/token)"
                      f" -> {row['ratio']:.2f}x wall, {row['cpu_ratio']:.2f}x CPU; same answers {100 * same:.0f}%, "
                      f"same tokens before the first difference {100 * prefix:.0f}%", flush=True)
        del model

    print("\nratio ours / transformers (new tokens per second; wall | CPU time)")
    cols = [(b, t) for t in sorted({r["threads"] for r in rows}) for b in sorted({r["batch"] for r in rows})]
    print("       " + "".join(f"   batch {b}, {t} thr  " for b, t in cols))
    for dtype in args.dtypes.split(","):
        cells = []
        for b, t in cols:
            r = next((r for r in rows if r["dtype"] == dtype and r["batch"] == b and r["threads"] == t), None)
            cells.append(f"  {r['ratio']:5.2f}x | {r['cpu_ratio']:5.2f}x  " if r else " " * 21)
        print(f"{dtype:>6} " + "".join(cells))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    (out_dir / "generate.json").write_text(json.dumps({"model": args.model, "new_tokens": args.new_tokens,
                                                      "prompts": len(prompts), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
