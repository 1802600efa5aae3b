#!/usr/bin/env python3
"""Reference for tests/model/test_quant4.cpp: bitsandbytes' 4-bit quantization on the CPU.

bitsandbytes.functional.quantize_4bit (nf4 / fp4, compress_statistics = nested on / off) and
dequantize_4bit (fp32 and bf16) are the byte-exact references. Written to --out:
  cases.safetensors   synthetic tensors (odd sizes, partial last blocks, blocksizes 32..4096,
                      values exactly on code-book midpoints, an all-zero block, > 32,768 blocks),
                      and every linear of a tiny LLaMA (tests/fixtures/configs/tiny_llama2_gqa.json,
                      seed 0): `name.input`, and for case c, `c.packed`, `c.absmax`, `c.nested_absmax`,
                      `c.offset`, `c.deq_fp32`, `c.deq_bf16`
  cases.json          per case: type, blocksize, nested, shape, and which dequantizer is the
                      reference (see BNB_AVX512_NOTE)
  smollm2.safetensors every linear of SmolLM2-135M-Instruct (models/smollm2-135m-instruct, made by
                      scripts/make_smollm2.py; skipped with a message when absent): nf4 + nested
                      from the fp32 weights, fp4 from the bf16 cast: packed bytes, absmax, nested
                      statistics in full; the dequantized weights as position-weighted checksums
                      (checksum() below) to keep the fixture small
The offset (mean of the absmax values) is computed with one intra-op thread: LibTorch's reduction
order, and so its rounding, depends on the thread count above 32,768 values.
"""
import argparse
import json
import os
from pathlib import Path

# The default dequantizer (the flat-block reference) eager, as written, not through torch.compile.
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

import bitsandbytes.functional as F  # noqa: E402
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TINY_CONFIG = REPO / "tests" / "fixtures" / "configs" / "tiny_llama2_gqa.json"
SMOLLM2 = REPO / "models" / "smollm2-135m-instruct"

# bitsandbytes 0.50's AVX-512 dequantize_4bit indexes absmax as row * (cols // blocksize) +
# col // blocksize when cols % 16 == 0, which is its flat-block layout only when cols % blocksize
# == 0 (every LLaMA linear). For other such shapes (e.g. (48, 80)) it reads other blocks' scales;
# the quantizer's flat layout (backends/default/ops.py, the scalar kernel) is then the reference.
BNB_AVX512_NOTE = "default_ops"


def checksum(t):
    """sum_i bits_i * (i % 65521 + 1) over the raw bits, int64 with wrap-around (the C++ twin in
    test_quant4.cpp): any changed value changes it."""
    flat = t.contiguous().reshape(-1)
    bits = flat.view(torch.int32 if flat.element_size() == 4 else torch.int16).to(torch.int64)
    if flat.element_size() == 2:
        bits = bits & 0xFFFF
    else:
        bits = bits & 0xFFFFFFFF
    w = torch.arange(flat.numel(), dtype=torch.int64) % 65521 + 1
    return int((bits * w).sum())


def quantize(x, qt, nested, bs):
    packed, st = F.quantize_4bit(x, blocksize=bs, compress_statistics=nested, quant_type=qt)
    out = {"packed": packed.reshape(-1).clone()}
    if nested:
        out["absmax"] = st.absmax.clone()
        out["nested_absmax"] = st.state2.absmax.clone()
        out["offset"] = st.offset.reshape(1).float().clone()
        assert torch.equal(st.state2.code, F.create_dynamic_map()), "nested code is not the dynamic map"
    else:
        out["absmax"] = st.absmax.clone()
    deq = {}
    for name, dt in (("deq_fp32", torch.float32), ("deq_bf16", torch.bfloat16)):
        st.dtype = dt
        deq[name] = F.dequantize_4bit(packed, st)
    # The flat-block definition (what the quantizer used), from the default kernel.
    absmax = st.absmax
    if nested:
        absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
    code = F.get_4bit_type(qt, device="cpu")
    ref = "dequantize_4bit"
    for name, dt in (("deq_fp32", torch.float32), ("deq_bf16", torch.bfloat16)):
        flat = _dequantize_4bit_compute(packed.reshape(-1), absmax.float(), code, bs, tuple(x.shape), dt)
        if not torch.equal(flat.view(-1).view(torch.int16 if dt == torch.bfloat16 else torch.int32),
                           deq[name].reshape(-1).view(torch.int16 if dt == torch.bfloat16 else torch.int32)):
            ref = BNB_AVX512_NOTE
            deq[name] = flat.reshape(x.shape)
    out.update(deq)
    return out, ref


def synthetic_cases():
    g = torch.Generator().manual_seed(1234)
    cases = []
    for shape, dt, bs in [((777,), torch.float32, 64), ((333,), torch.bfloat16, 64), ((5, 130), torch.float32, 64),
                          ((48, 80), torch.bfloat16, 64), ((1000,), torch.float32, 32), ((3, 4096), torch.bfloat16, 128),
                          ((9000,), torch.float32, 4096), ((64, 96), torch.float16, 64), ((1,), torch.float32, 64),
                          ((320, 8192), torch.bfloat16, 64)]:
        x = (torch.randn(shape, generator=g) * 0.05).to(dt)
        cases.append((f"rand_{'x'.join(map(str, shape))}_{str(dt)[6:]}_b{bs}", x, bs))
    # Values exactly on the midpoints of each code book (absmax 1 from the first element), an
    # all-zero block, and a partial block of zeros (absmax clamped to 1e-38).
    for qt in ("nf4", "fp4"):
        code = F.get_4bit_type(qt, device="cpu")
        srt = torch.sort(code).values
        mids = (srt[:-1] + srt[1:]) / 2
        x = torch.cat([torch.ones(1), mids, -mids, torch.zeros(64 - 1 - 30), torch.zeros(64), torch.zeros(7)])
        cases.append((f"edges_{qt}", x, 64))
    return cases


def tiny_linears():
    from transformers import AutoModelForCausalLM, LlamaConfig
    with open(TINY_CONFIG) as f:
        raw = json.load(f)
    cfg = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "transformers_version")})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float()
    return [(n, p.detach().clone()) for n, p in model.named_parameters()
            if p.dim() == 2 and "layers." in n and n.endswith("proj.weight")]


def write_cases(out):
    tensors, meta = {}, {}
    items = [(n, x, bs, qt, nested) for n, x, bs in synthetic_cases() for qt in ("nf4", "fp4") for nested in (False, True)]
    items += [("tiny." + n, x, 64, qt, nested) for n, x in tiny_linears() for qt, nested in (("nf4", True), ("fp4", False))]
    for name, x, bs, qt, nested in items:
        key = f"{name}.{qt}.{'nested' if nested else 'plain'}"
        res, ref = quantize(x, qt, nested, bs)
        tensors[name + ".input"] = x.contiguous().clone()
        for k, v in res.items():
            tensors[f"{key}.{k}"] = v.contiguous()
        meta[key] = {"input": name + ".input", "type": qt, "blocksize": bs, "nested": nested, "shape": list(x.shape), "dequant_reference": ref}
    save_file(tensors, str(out / "cases.safetensors"))
    with open(out / "cases.json", "w") as f:
        json.dump(meta, f, indent=1)
    return len(meta)


def write_smollm2(out):
    path = SMOLLM2 / "model.safetensors"
    if not path.exists():
        (out / "smollm2_SKIPPED").write_text(f"{path} not found (make it with scripts/make_smollm2.py)\n")
        print("SmolLM2 part skipped:", path, "not found")
        return 0
    weights = load_file(str(path))
    tensors, meta = {}, {}
    for name, w in weights.items():
        if not (w.dim() == 2 and "layers." in name and name.endswith("proj.weight")):
            continue
        for qt, nested, dt in (("nf4", True, torch.float32), ("fp4", False, torch.bfloat16)):
            key = f"{name}.{qt}.{'nested' if nested else 'plain'}"
            res, ref = quantize(w.to(dt), qt, nested, 64)
            for k in ("packed", "absmax", "nested_absmax", "offset"):
                if k in res:
                    tensors[f"{key}.{k}"] = res[k]
            meta[key] = {"tensor": name, "type": qt, "blocksize": 64, "nested": nested, "input_dtype": str(dt)[6:],
                         "dequant_reference": ref, "deq_fp32_checksum": checksum(res["deq_fp32"]),
                         "deq_bf16_checksum": checksum(res["deq_bf16"])}
    save_file(tensors, str(out / "smollm2.safetensors"))
    with open(out / "smollm2.json", "w") as f:
        json.dump({"model": str(SMOLLM2), "cases": meta}, f, indent=1)
    return len(meta)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = write_cases(out)
    m = write_smollm2(out)
    print(f"quant4 fixture: {n} cases, {m} SmolLM2 linears -> {out}")


if __name__ == "__main__":
    main()
