#!/usr/bin/env python3
"""Generation throughput: new tokens per second, ours (bench_generate) vs transformers' generate,
same model, same prompts (tokenized once, by the model's own tokenizer), same thread count,
greedy, fp32, batch 1 and batch 8. Prints a table and the ratios; writes --out/generate.json.

  .venv/bin/python bench/generate_bench.py --model models/smollm2-135m-instruct --threads 2
Each side gets one warm-up generation first; the two sides alternate per case, so a busy machine
slows both alike.
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
    n, secs, cpu = 0, 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            group = prompts[i:i + batch]
            t = max(len(p) for p in group)
            ids = torch.full((len(group), t), pad, dtype=torch.long)
            mask = torch.zeros((len(group), t), dtype=torch.long)
            for r, p in enumerate(group):
                ids[r, t - len(p):] = torch.tensor(p)
                mask[r, t - len(p):] = 1
            t0, c0 = time.perf_counter(), time.process_time()
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad)
            secs += time.perf_counter() - t0
            cpu += time.process_time() - c0
            for r in range(len(group)):
                new = out[r, t:].tolist()
                k = next((j + 1 for j, x in enumerate(new) if x in eos), len(new))
                n += k
    return n, secs, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--bin", default=str(REPO / "build" / "tests" / "generate" / "bench_generate"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--out", default=str(REPO / "build" / "bench"))
    args = ap.parse_args()
    os.environ.update(OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(args.threads)

    tok = AutoTokenizer.from_pretrained(args.model)
    gcfg = json.loads((Path(args.model) / "generation_config.json").read_text())
    eos = gcfg["eos_token_id"] if isinstance(gcfg["eos_token_id"], list) else [gcfg["eos_token_id"]]
    pad = gcfg.get("pad_token_id", eos[0])
    records = json.loads((REPO / "data" / "synthetic_eval.json").read_text())[:args.prompts]
    prompts = [tok((PROMPT_INPUT if r.get("input") else PROMPT_NO_INPUT).format_map(r))["input_ids"] for r in records]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    pfile = out_dir / "generate_prompts.json"
    pfile.write_text(json.dumps({"prompts": prompts, "eos_token_id": eos, "pad_token_id": pad}))

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa").eval()
    transformers_run(model, prompts[:1], 1, 4, eos, pad)  # warm-up
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        res = subprocess.run([args.bin, args.model, str(pfile), str(batch), str(args.new_tokens)], check=True,
                             capture_output=True, text=True)
        ours = json.loads(res.stdout.strip().splitlines()[-1])
        n_hf, s_hf, c_hf = transformers_run(model, prompts, batch, args.new_tokens, eos, pad)
        row = {"batch": batch, "threads": args.threads, "ours_tokens": ours["new_tokens"], "ours_s": ours["seconds"],
               "ours_cpu_s": ours["cpu_seconds"], "ours_tok_s": ours["tokens_per_s"], "hf_tokens": n_hf, "hf_s": s_hf,
               "hf_cpu_s": c_hf, "hf_tok_s": n_hf / s_hf}
        row["ratio"] = row["ours_tok_s"] / row["hf_tok_s"]
        row["cpu_ratio"] = (c_hf / n_hf) / (ours["cpu_seconds"] / ours["new_tokens"])
        rows.append(row)
        print(f"batch {batch}, {args.threads} thread(s): ours {row['ours_tok_s']:.1f} tok/s "
              f"({ours['new_tokens']} tokens, {1e3 * ours['cpu_seconds'] / ours['new_tokens']:.1f} CPU-ms/token), "
              f"transformers {row['hf_tok_s']:.1f} tok/s ({n_hf} tokens, {1e3 * c_hf / n_hf:.1f} CPU-ms/token) "
              f"-> ratio {row['ratio']:.2f}x wall, {row['cpu_ratio']:.2f}x CPU", flush=True)
    (out_dir / "generate.json").write_text(json.dumps({"model": args.model, "new_tokens": args.new_tokens,
                                                      "prompts": len(prompts), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
