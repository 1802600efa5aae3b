"""alpaca-train vs PyTorch FSDP on CPU, side by side, in one command (issue 9).

Both sides train the same randomly initialised LLaMA (an HF directory written here with
transformers, so both load identical weights) on the same Alpaca-format data, tokenized to full
model_max_length sequences (every example is longer than the limit, so every sequence has exactly
seq_len tokens and no padding on either side), with the same global batch, steps, AdamW and
threads per rank. Runs alternate (ours, theirs, ours, ...) so machine noise hits both.
Reported per case: median step time (first --warmup steps excluded), tokens/s, peak RSS per
rank, ours/PyTorch ratios, and MFU-CPU: 6 N tokens/s over this machine's matmul peak in the case's
dtype, measured in the same run (torch.matmul, 2048^3, one thread, in process CPU time so that
other load on the machine does not lower it, times the cores the case uses); the CPU model heads
the table. Written as results.json, results.md and chart.png (matplotlib) in --out.

  python bench/bench.py --quick                 # CI: tiny model, 2 ranks, fp32, a few steps
  python bench/bench.py                         # full: tiny+small, 1/2/4 ranks, fp32+bf16
  python bench/bench.py --sizes small --ranks 2 --dtypes bf16 --steps 8 --reps 3
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

MODELS = {
    # CI-sized: the real 32k vocabulary dominates (8M of 9M parameters).
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4),
    # ~106M parameters: 8 layers of width 768 plus 2 x 32001 x 768 embeddings.
    "small": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
                  num_key_value_heads=12),
    # ~272M parameters (16 layers of width 1024): the save benchmark's larger synthetic model, whose
    # checkpoint (fp32 weights + 2 AdamW moments, ~3.3 GB) fits a 24 GiB machine at 4 ranks with the
    # async staging copy (a 438M one ran out of memory there beside other jobs).
    "medium": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                   num_key_value_heads=16),
}
PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:")
PROMPT_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
                "### Input:\n{input}\n\n### Response:")


# A CPU benchmark: on a machine with a GPU both sides would take it (our trainer picks NCCL, the
# PyTorch script CUDA), and two ranks on one GPU fail. Hide it from both.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def log(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def shared_dir() -> Path:
    return Path(os.environ.get("ALPACA_SHARED_DIR", ROOT.parent / "shared")) / "data"


def add_case_flags(ap: argparse.ArgumentParser, seq_len: int, steps: int) -> None:
    """The flags of one case of this benchmark run by another script (ab_ours.py, profile_step.py):
    model size, dtype, sequence length, batches, steps, our sharding, QLoRA, and the output folder.
    Each script adds its own --ranks (one world size or a list)."""
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seq_len", type=int, default=seq_len)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--global_batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--fsdp", default="full_shard", help="our sharding strategy (bench.py --fsdp)")
    ap.add_argument("--qlora", action="store_true", help="QLoRA r=16 (bench.py --qlora): a 4-bit nf4 nested base on our "
                    "side, transformers + bitsandbytes 4-bit + peft on the other")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench"))


def python_bin() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def make_model(size: str, out: Path, tokenizer_model: Path) -> Path:
    d = out / f"model_{size}"
    if (d / "config.json").exists():
        return d
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    # 32001 = LLaMA-2's 32000 + [PAD], the vocabulary train.py ends with; pad id 32000.
    cfg = LlamaConfig(vocab_size=32001, max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=1,
                      eos_token_id=2, pad_token_id=32000, tie_word_embeddings=False, **MODELS[size])
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(d, safe_serialization=True)
    shutil.copy(tokenizer_model, d / "tokenizer.model")
    (d / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "[PAD]"}))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "pad_token": "[PAD]", "add_bos_token": True, "add_eos_token": False, "model_max_length": 4096}))
    n = sum(p.numel() for p in model.parameters())
    log(f"model {size}: {n / 1e6:.1f}M parameters -> {d}")
    return d


def make_data(out: Path, alpaca_json: Path, tokenizer_model: Path, seq_len: int, num: int) -> tuple[Path, Path]:
    """Alpaca records whose response is long enough that every example fills seq_len tokens."""
    js, pt = out / f"data_{seq_len}.json", out / f"data_{seq_len}.pt"
    if js.exists() and pt.exists():
        return js, pt
    import sentencepiece as spm
    import torch

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_model))
    records = json.loads(alpaca_json.read_text())[:num]
    out_records, ids, labels = [], [], []
    for r in records:
        source = (PROMPT_INPUT if r.get("input", "") else PROMPT_NO_INPUT).format_map(r)
        src_ids = [sp.bos_id()] + sp.encode(source)
        output = r["output"]
        while len(src_ids) + len(sp.encode(output)) < seq_len + 8:
            output = output + " " + r["output"]
        full = ([sp.bos_id()] + sp.encode(source + output))[:seq_len]
        lab = list(full)
        for i in range(min(len(src_ids), seq_len)):
            lab[i] = -100
        out_records.append({"instruction": r["instruction"], "input": r.get("input", ""), "output": output})
        ids.append(full)
        labels.append(lab)
    js.write_text(json.dumps(out_records))
    torch.save({"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)}, pt)
    log(f"data: {len(ids)} examples x {seq_len} tokens -> {js}")
    return js, pt


def peak_rss_list(results: dict) -> list:
    return results.get("peak_rss_bytes_per_rank", [])


def run_torch(case: dict, model_dir: Path, data_pt: Path, work: Path, timeout: int) -> dict:
    out = work / f"torch_{case['name']}_{time.time_ns()}.json"
    env = dict(os.environ, **CPU_ONLY, OMP_NUM_THREADS=str(case["threads"]), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    torchrun = str(Path(python_bin()).parent / "torchrun")
    cmd = [torchrun, "--standalone", f"--nproc_per_node={case['ranks']}", str(HERE / "torch_fsdp_train.py"),
           "--model_dir", str(model_dir), "--data", str(data_pt), "--out", str(out),
           "--per_device_batch", str(case["batch"]), "--grad_accum", str(case["accum"]), "--steps", str(case["steps"]),
           "--dtype", case["dtype"], "--threads", str(case["threads"])]
    if case.get("lora_r"):
        cmd += ["--lora_r", str(case["lora_r"])]
    if case.get("load_in_4bit"):
        cmd += ["--load_in_4bit"]
    cmd += case.get("torch_args", [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {(p.stdout + p.stderr)[-1500:]}"}
    return json.loads(out.read_text())


def train_bin() -> Path:
    return Path(os.environ.get("ALPACA_TRAIN_BIN", ROOT / "build" / "alpaca-train"))


def run_ours(case: dict, model_dir: Path, data_json: Path, work: Path, timeout: int) -> dict:
    out_dir = work / f"ours_{case['name']}_{time.time_ns()}"
    env = dict(os.environ, **CPU_ONLY, OMP_NUM_THREADS=str(case["threads"]), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    train = [str(train_bin()), "--model_name_or_path", str(model_dir), "--data_path", str(data_json),
             "--output_dir", str(out_dir), "--max_steps", str(case["steps"]),
             "--per_device_train_batch_size", str(case["batch"]), "--gradient_accumulation_steps", str(case["accum"]),
             "--model_max_length", str(case["seq_len"]), "--learning_rate", "1e-5", "--weight_decay", "0.",
             "--lr_scheduler_type", "constant", "--logging_steps", "1", "--save_strategy", "no",
             "--report_to", "jsonl", "--fsdp", f"{case.get('fsdp', 'full_shard')} auto_wrap",
             "--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer", "--seed", "42",
             "--dataloader_num_workers", "0"]
    if case["dtype"] == "bf16":
        train += ["--bf16", "True"]
    train += ["--optim", case.get("optim", "adamw_torch")]
    if case.get("lora_r"):
        train += ["--use_peft", "True", "--lora_r", str(case["lora_r"]), "--lora_alpha", str(2 * case["lora_r"]),
                  "--lora_dropout", "0", "--lora_target_modules", "q_proj v_proj"]
    if case.get("load_in_4bit"):
        train += ["--load_in_4bit", "True", "--bnb_4bit_quant_type", "nf4", "--use_bnb_nested_quant", "True"]
    cmd = ["mpirun", "-np", str(case["ranks"]), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-x", "OMP_NUM_THREADS", "-x", "CUDA_VISIBLE_DEVICES"] + train
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    metrics = out_dir / "metrics.jsonl"
    if p.returncode != 0 or not metrics.exists():
        return {"error": f"exit {p.returncode}: {(p.stdout + p.stderr)[-1500:]}"}
    step_times, losses, rss = [], [], []
    tokens_per_step = None
    for line in metrics.read_text().splitlines():
        e = json.loads(line)
        if "step_time" in e:
            step_times.append(e["step_time"])
            losses.append(e.get("loss"))
            tokens_per_step = e.get("tokens_per_step", tokens_per_step)
        per_rank = sorted((int(k.rsplit("rank", 1)[1]), v) for k, v in e.items()
                          if k.startswith("peak_host_rss_bytes_rank"))
        if per_rank:
            rss = [v for _, v in per_rank]
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"impl": "alpaca-train", "world": case["ranks"], "step_times": step_times, "losses": losses,
            "tokens_per_step": tokens_per_step or case["ranks"] * case["batch"] * case["accum"] * case["seq_len"],
            "peak_rss_bytes_per_rank": rss}


def summarize(runs: list, warmup: int) -> dict:
    ok = [r for r in runs if "error" not in r and r.get("step_times")]
    if not ok:
        return {"error": runs[-1].get("error", "no steps recorded") if runs else "not run"}
    times = [t for r in ok for t in r["step_times"][warmup:]] or [t for r in ok for t in r["step_times"]]
    med = statistics.median(times)
    tokens = ok[0]["tokens_per_step"]
    rss = max((max(r["peak_rss_bytes_per_rank"]) for r in ok if r["peak_rss_bytes_per_rank"]), default=None)
    return {"median_step_s": med, "tokens_per_s": tokens / med, "tokens_per_step": tokens,
            "peak_rss_mb_per_rank_max": rss / 2**20 if rss else None, "num_step_samples": len(times),
            "final_loss": ok[-1]["losses"][-1] if ok[-1].get("losses") else None}


def ratio(a, b):
    return a / b if a and b else None


# Every library's switch down to AVX2: what an AVX2-only machine would run, measured on this one.
CPU_ISA_AVX2_ENV = dict(ALPACA_CPU_ISA="avx2", ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                        ONEDNN_MAX_CPU_ISA="AVX2")


def cpu_model() -> str:
    """`lscpu`'s Model name (what docs quote), else /proc/cpuinfo's; says so when capped (--cpu_isa)."""
    name = cpu_model_name()
    return f"{name} (capped at AVX2: {CPU_ISA_AVX2_ENV})" if os.environ.get("ALPACA_CPU_ISA") == "avx2" else name


def cpu_model_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


MATMUL_PEAK_SCRIPT = r"""
import json, sys, time, torch
torch.set_num_threads(1)
n = int(sys.argv[1]); out = {}
dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
for name in sys.argv[2].split(","):
    dt = dtypes[name]
    a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
    t = time.process_time(); a @ b; first = time.process_time() - t
    best = 2 * n**3 / first
    # A product slower than a second is no GEMM kernel (bf16 on an AVX2-only CPU is a scalar loop,
    # ~10-40 s for one 2048^3): its first run is the measurement, not the best of three more.
    for _ in range(3 if first < 1.0 else 0):
        t = time.process_time(); a @ b; best = max(best, 2 * n**3 / (time.process_time() - t))
    out[name] = best
print(json.dumps(out))
"""


def matmul_peak_per_core(dtypes, n: int = 2048) -> dict:
    """FLOP/s of one core in torch.matmul (n^3, one thread) for each dtype the cases run, best of 3, in
    process CPU time."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([python_bin(), "-c", MATMUL_PEAK_SCRIPT, str(n), ",".join(dtypes)], env=env,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        log(f"matmul peak not measured: {p.stderr[-300:]}")
        return {}
    return json.loads(p.stdout.strip().splitlines()[-1])


def model_num_parameters(model_dir: Path) -> int:
    """Parameter count from the safetensors headers (no weights read)."""
    n = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for k, v in header.items():
            if k != "__metadata__":
                count = 1
                for d in v["shape"]:
                    count *= d
                n += count
    return n


def mfu_cpu(tokens_per_s, num_params: int, case: dict, peaks: dict):
    """6 N tokens/s over the per-core matmul peak times the cores the case runs on."""
    peak = peaks.get(case["dtype"])
    # Below 10 GFLOP/s a core torch.matmul is no real GEMM in this dtype (bf16 on an AVX2-only CPU is a
    # scalar loop): a ratio against it would read in the thousands of percent, so none is printed.
    if not tokens_per_s or not peak or peak < 10e9 or not num_params:
        return None
    cores = min(case["ranks"] * case["threads"], os.cpu_count() or 1)
    return 6.0 * num_params * tokens_per_s / (peak * cores)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI mode: tiny, 2 ranks, fp32, 4 steps, 1 repetition")
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2, help="per-device micro-batch")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--global_batch", type=int, default=8,
                    help="kept fixed across world sizes by adjusting accumulation (0 = batch*accum*ranks)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="steps excluded from the median")
    ap.add_argument("--reps", type=int, default=2, help="alternating repetitions per side")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (both sides)")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench"))
    ap.add_argument("--only", choices=["ours", "torch"], help="run one side only")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--lora_r", type=int, default=0, help="> 0: both sides train a LoRA adapter (peft / --use_peft)")
    ap.add_argument("--fsdp", default="full_shard",
                    help="our sharding strategies, comma-separated (full_shard, shard_grad_op, no_shard, hybrid_shard): "
                         "a case each, every one beside its own reference runs")
    ap.add_argument("--qlora", action="store_true",
                    help="QLoRA: --load_in_4bit (nf4, nested) on our side; transformers + bitsandbytes 4-bit + peft "
                    "(DDP at world > 1) on the other; implies --lora_r 16 unless given")
    ap.add_argument("--optims", default="adamw_torch",
                    help="comma list of our --optim values (e.g. adamw_torch,adamw_8bit); PyTorch's side runs "
                         "torch's AdamW, so only for adamw_torch cases")
    ap.add_argument("--replot", metavar="RESULTS_JSON", help="only redraw chart.png (into --out) from a results.json")
    ap.add_argument("--cpu_isa", choices=["native", "avx2"], default="native",
                    help="avx2: both sides run as on an AVX2-only CPU (ours: ALPACA_CPU_ISA; ATen, MKL and oneDNN: "
                         "ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA), the matmul peak too")
    args = ap.parse_args()
    if args.cpu_isa == "avx2":
        os.environ.update(CPU_ISA_AVX2_ENV)
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_chart(Path(args.out) / "chart.png", saved["meta"], saved["results"])
        log(f"wrote {Path(args.out) / 'chart.png'}")
        return 0
    if args.quick:
        args.sizes, args.ranks, args.dtypes, args.steps, args.warmup, args.reps = "tiny", "2", "fp32", 4, 1, 1
        args.seq_len = min(args.seq_len, 512)
    if args.qlora and not args.lora_r:
        args.lora_r = 16

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = shared_dir() / "llama2-tokenizer" / "tokenizer.model"
    alpaca = shared_dir() / "alpaca" / "alpaca_5000.json"
    for p in (tok, alpaca):
        if not p.exists():
            log(f"missing {p}; set ALPACA_SHARED_DIR to the shared/ folder holding data/llama2-tokenizer/ and data/alpaca/")
            return 2
    n_examples = 256
    data_json, data_pt = make_data(out, alpaca, tok, args.seq_len, n_examples)

    cases = []
    for size in args.sizes.split(","):
        for ranks in [int(r) for r in args.ranks.split(",")]:
            for dtype in args.dtypes.split(","):
                batch, accum = args.batch, args.accum
                if args.global_batch:
                    per_rank = max(args.global_batch // ranks, 1)
                    batch = min(args.batch, per_rank)
                    accum = max(per_rank // batch, 1)
                for fsdp in args.fsdp.split(","):
                    for optim in args.optims.split(","):
                        tag = ("" if fsdp == "full_shard" else f"_{fsdp}") + ("" if optim == "adamw_torch" else f"_{optim}")
                        cases.append(dict(name=f"{size}_{ranks}r_{dtype}{tag}", size=size, ranks=ranks, dtype=dtype,
                                          batch=batch, accum=accum, steps=args.steps, seq_len=args.seq_len,
                                          threads=args.threads, lora_r=args.lora_r, load_in_4bit=args.qlora, fsdp=fsdp,
                                          optim=optim))
    have_ours = train_bin().exists()
    if not have_ours and args.only != "torch":
        log(f"{train_bin()} not built; only the PyTorch side runs (build with ninja -C build alpaca-train)")

    model_name = cpu_model()
    peaks = matmul_peak_per_core(sorted({c["dtype"] for c in cases}))
    log(f"CPU: {model_name}; matmul peak per core: " +
        ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peaks.items()))
    results = []
    for case in cases:
        model_dir = make_model(case["size"], out, tok)
        num_params = model_num_parameters(model_dir)
        runs = {"ours": [], "torch": []}
        for rep in range(args.reps):
            for side in ("ours", "torch"):
                if args.only and side != args.only:
                    continue
                if side == "torch" and case.get("optim", "adamw_torch") != "adamw_torch":
                    continue  # PyTorch's side trains with torch's AdamW only
                if side == "ours" and not have_ours:
                    continue
                t0 = time.time()
                try:
                    r = (run_ours(case, model_dir, data_json, out, args.timeout) if side == "ours"
                         else run_torch(case, model_dir, data_pt, out, args.timeout))
                except subprocess.TimeoutExpired:
                    r = {"error": f"timed out after {args.timeout} s"}
                runs[side].append(r)
                status = r.get("error", "ok")[:300]
                load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
                log(f"{case['name']} rep {rep} {side}: {time.time() - t0:.1f} s wall, load {load}, {status}")
        ours, theirs = summarize(runs["ours"], args.warmup), summarize(runs["torch"], args.warmup)
        row = dict(case=case, ours=ours, pytorch=theirs,
                   tokens_per_s_ratio=ratio(ours.get("tokens_per_s"), theirs.get("tokens_per_s")),
                   peak_rss_ratio=ratio(ours.get("peak_rss_mb_per_rank_max"), theirs.get("peak_rss_mb_per_rank_max")),
                   num_params=num_params, ours_mfu_cpu=mfu_cpu(ours.get("tokens_per_s"), num_params, case, peaks),
                   pytorch_mfu_cpu=mfu_cpu(theirs.get("tokens_per_s"), num_params, case, peaks))
        results.append(row)
        log(f"{case['name']}: ours {ours.get('tokens_per_s')} tok/s, pytorch {theirs.get('tokens_per_s')} tok/s, "
            f"ratio {row['tokens_per_s_ratio']}, MFU-CPU ours {row['ours_mfu_cpu']} pytorch {row['pytorch_mfu_cpu']}, "
            f"rss ratio {row['peak_rss_ratio']}")

    import platform

    meta = dict(host=platform.node(), cpus=os.cpu_count(), when=time.strftime("%Y-%m-%d %H:%M:%S"),
                cpu_model=model_name, matmul_peak_flops_per_core=peaks,
                load_average=os.getloadavg(), seq_len=args.seq_len, steps=args.steps, warmup=args.warmup, reps=args.reps, threads=args.threads,
                quick=args.quick, lora_r=args.lora_r, qlora=args.qlora)
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    md = write_markdown(out / "results.md", meta, results)
    write_chart(out / "chart.png", meta, results)
    print(md)
    log(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'chart.png'}")
    # Figures are printed, not asserted; but a side that was run and failed fails the command.
    failed = [r["case"]["name"] for r in results for side, key in (("ours", "ours"), ("torch", "pytorch"))
              if (not args.only or args.only == side) and not (side == "ours" and not have_ours) and "error" in r[key]]
    if failed:
        log(f"failed cases: {', '.join(failed)}")
        return 1
    return 0


def write_chart(path: Path, meta: dict, results: list) -> None:
    """Tokens/s and peak RSS per rank of both sides for every case, as grouped bars (matplotlib,
    Agg); the ours/PyTorch ratio is written above each pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["case"]["name"] for r in results]
    x = list(range(len(names)))
    w = 0.38
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(names) + 3), 8), constrained_layout=True)
    for ax, key, rkey, ylabel in ((axes[0], "tokens_per_s", "tokens_per_s_ratio", "tokens/s"),
                                  (axes[1], "peak_rss_mb_per_rank_max", "peak_rss_ratio", "peak RSS per rank (MiB)")):
        for off, side, label in ((-w / 2, "ours", "alpaca-train"), (w / 2, "pytorch", "PyTorch FSDP")):
            vals = [r[side].get(key) or 0 for r in results]
            ax.bar([i + off for i in x], vals, w, label=label)
        for i, r in enumerate(results):
            top = max(r["ours"].get(key) or 0, r["pytorch"].get(key) or 0)
            if r.get(rkey):
                ax.annotate(f"{r[rkey]:.2f}x", (i, top), ha="center", va="bottom", fontsize="small",
                            xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.margins(y=0.15)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_yscale("log")  # cases differ by 20x; on a log axis the ratio is the gap between bars
    axes[0].set_title(f"alpaca-train vs PyTorch FSDP on CPU ({meta.get('cpus')} CPUs, {meta.get('threads')} thread/rank, "
                      f"seq {meta.get('seq_len')}; label = ours/PyTorch)")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _f(v, fmt="{:.1f}"):
    return fmt.format(v) if isinstance(v, (int, float)) else "n/a"


def _pct(v):
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else "n/a"


def case_tag(case: dict) -> str:
    tag = f" {case['fsdp']}" if case.get("fsdp", "full_shard") != "full_shard" else ""
    return tag + (f" {case['optim']}" if case.get("optim", "adamw_torch") != "adamw_torch" else "")


def write_markdown(path: Path, meta: dict, results: list) -> str:
    other = ("transformers + bitsandbytes 4-bit + peft (DDP at world > 1)" if meta.get("qlora")
             else "PyTorch FSDP")
    what = (f"QLoRA r={meta.get('lora_r')} nf4 nested, q_proj v_proj: " if meta.get("qlora")
            else f"LoRA r={meta['lora_r']}: " if meta.get("lora_r") else "")
    lines = [f"# {what}alpaca-train vs {other} (CPU, gloo) — {meta['when']}, {meta['cpus']} CPUs",
             "",
             f"seq {meta['seq_len']}, {meta['steps']} steps ({meta['warmup']} warm-up excluded), "
             f"{meta['reps']} alternating reps, {meta['threads']} thread(s) per rank",
             "",
             f"CPU: {meta.get('cpu_model', 'n/a')}; matmul peak per core (torch.matmul 2048^3, 1 thread, CPU time): "
             + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in (meta.get("matmul_peak_flops_per_core") or {}).items())
             + f"; load average at the end {', '.join(f'{x:.1f}' for x in meta.get('load_average') or [])}. "
             "MFU-CPU = 6 N tokens/s / (peak per core x cores used).",
             "",
             "| case | ranks | dtype | global batch | ours step s | torch step s | ours tok/s | torch tok/s | "
             "tok/s ratio | ours MFU-CPU | torch MFU-CPU | ours RSS MB/rank | torch RSS MB/rank | RSS ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c, o, t = r["case"], r["ours"], r["pytorch"]
        gb = c["ranks"] * c["batch"] * c["accum"]
        lines.append(f"| {c['size']}{case_tag(c)} | {c['ranks']} | {c['dtype']} | {gb} | {_f(o.get('median_step_s'), '{:.3f}')} | "
                     f"{_f(t.get('median_step_s'), '{:.3f}')} | {_f(o.get('tokens_per_s'))} | {_f(t.get('tokens_per_s'))} | "
                     f"{_f(r['tokens_per_s_ratio'], '{:.2f}')} | {_pct(r.get('ours_mfu_cpu'))} | "
                     f"{_pct(r.get('pytorch_mfu_cpu'))} | {_f(o.get('peak_rss_mb_per_rank_max'))} | "
                     f"{_f(t.get('peak_rss_mb_per_rank_max'))} | {_f(r['peak_rss_ratio'], '{:.2f}')} |")
    errors = [(r["case"]["name"], side, r[side]["error"]) for r in results for side in ("ours", "pytorch")
              if "error" in r[side]]
    if errors:
        lines += ["", "Errors:"] + [f"- {n} {s}: `{e[:200]}`" for n, s, e in errors]
    # Scaling: tokens/s and per-rank memory against world size, per size and dtype.
    lines += ["", "## Scaling (tokens/s, peak RSS MB per rank)", "", "| size | dtype | ranks | ours tok/s | torch tok/s | "
              "ours RSS | torch RSS |", "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["case"]["size"], r["case"]["dtype"], r["case"].get("fsdp", ""), r["case"]["ranks"])):
        c, o, t = r["case"], r["ours"], r["pytorch"]
        lines.append(f"| {c['size']}{case_tag(c)} | {c['dtype']} | {c['ranks']} | {_f(o.get('tokens_per_s'))} | "
                     f"{_f(t.get('tokens_per_s'))} | {_f(o.get('peak_rss_mb_per_rank_max'))} | "
                     f"{_f(t.get('peak_rss_mb_per_rank_max'))} |")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
