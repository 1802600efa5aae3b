"""PyTorch side of bench/profile_step.py: the same accounting as bench/train_profile.cpp (ours),
from torch.profiler's event tree of one training step of transformers' LlamaForCausalLM under FSDP.

Kinds come from record_function regions named like ours: "cat:<kind>" around transformers' modules
(RMSNorm, rotary embedding and apply_rotary_pos_emb, the MLP's SiLU*mul, the decoder layer's
residual adds, the attention, embeddings) and the loss; FSDP2's own "FSDP::*" regions are the
collectives and casts. A GEMM op is "gemm" wherever it runs; an autograd node takes the kind of
the forward op that made it (matched by sequence number). Self times are torch.profiler's
(wall-clock microseconds); the phases' CPU time comes from time.thread_time() around them.
Operand bytes, as train_profile.cpp counts ours: each leaf op (no child op) counts the bytes of its
tensor inputs (recorded shapes x dtype sizes; in-place and out= destinations included, fresh
outputs not), view and metadata ops nothing.
"""
import contextlib
import re
import time
from pathlib import Path

import torch
from torch.autograd.profiler import record_function

GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::addmm_",
        "aten::_addmm_activation", "aten::mkldnn_linear"}


def install_scopes(model) -> None:
    """record_function regions around transformers' modules, named as ours (cat:<kind>)."""
    import transformers.models.llama.modeling_llama as ml

    kinds = {ml.LlamaRMSNorm: "cat:rmsnorm", ml.LlamaRotaryEmbedding: "cat:rope", ml.LlamaMLP: "cat:silu_mul",
             ml.LlamaDecoderLayer: "cat:residual", ml.LlamaAttention: "cat:attention",
             torch.nn.Embedding: "cat:embedding"}
    for m in model.modules():
        for cls, name in kinds.items():
            if isinstance(m, cls):
                def pre(mod, args, name=name):
                    rf = record_function(name)
                    rf.__enter__()
                    mod._bench_rf = getattr(mod, "_bench_rf", []) + [rf]

                def post(mod, args, out):
                    mod._bench_rf.pop().__exit__(None, None, None)

                m.register_forward_pre_hook(pre)
                m.register_forward_hook(post)
    orig = ml.apply_rotary_pos_emb

    def rope(*a, **k):
        with record_function("cat:rope"):
            return orig(*a, **k)

    ml.apply_rotary_pos_emb = rope


class PhaseTimer:
    """Thread CPU and wall seconds per phase, accumulated over the steps it is used for."""

    def __init__(self):
        self.cpu, self.wall, self.steps = {}, {}, 0

    @contextlib.contextmanager
    def phase(self, name: str):
        c, w = time.thread_time(), time.perf_counter()
        with record_function("phase:" + name):
            yield
        self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w


def fsdp_kind(name: str) -> str:
    """FSDP2's regions in the groups ours reports: gathering (with its casts), reducing, the rest."""
    if any(w in name for w in ("all_gather", "pre_forward", "pre_backward", "backward_prefetch", "cast")):
        return "fsdp gather+cast"
    if any(w in name for w in ("reduce", "rs_wait", "accumulate")):
        return "fsdp reduce-scatter+grad"
    return "fsdp other"


def _kind_of(ev, seq_kind: dict, cache: dict) -> str:
    if ev.id in cache:
        return cache[ev.id]
    name = ev.name
    k = ""
    if name in GEMM:
        k = "gemm"
    elif name.startswith("FSDP::"):
        k = fsdp_kind(name)
    elif name.startswith("cat:"):
        k = name[4:]
    elif name.startswith("autograd::engine::evaluate_function: "):
        node = name.split(": ", 1)[1]
        k = seq_kind.get(ev.sequence_nr, "")
        if not k:
            if "AccumulateGrad" in node:
                k = "grad accumulate"
            elif node.startswith(("MmBackward", "AddmmBackward")):
                k = "gemm"
            elif "Attention" in node:
                k = "attention"
    if not k and ev.cpu_parent is not None:
        k = _kind_of(ev.cpu_parent, seq_kind, cache)
    cache[ev.id] = k
    return k


# The ops that move no tensor data (views, allocations, metadata): the list train_profile.cpp includes.
MOVES_NOTHING = set(re.findall(r'"(aten::[^"]+)"', (Path(__file__).parent / "moves_nothing.inc").read_text()))
# torch.profiler's dtype names -> bytes an element.
DTYPE_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "long": 8, "int": 4,
               "short int": 2, "short": 2, "bool": 1, "unsigned char": 1, "signed char": 1, "c10::complex<float>": 8,
               "c10::complex<double>": 16}


def _operand_bytes(ev) -> float:
    if ev.cpu_children or not ev.name.startswith("aten::") or ev.name in MOVES_NOTHING:
        return 0.0
    total = 0.0
    for shape, dtype in zip(ev.input_shapes or [], getattr(ev, "input_dtypes", None) or []):
        size = DTYPE_BYTES.get(dtype)
        if size and isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape):
            n = 1
            for d in shape:
                n *= d
            total += n * size
    return total


def _phase_of(ev) -> str:
    p = ev
    phase = "other"
    while p is not None:
        if p.name.startswith("phase:"):
            phase = p.name[6:]
        p = p.cpu_parent
    return phase


def summarize(prof, timer: PhaseTimer) -> dict:
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    cache, seq_kind = {}, {}
    # Forward ops in a kind's region: their autograd nodes inherit the kind.
    for e in events:
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::engine"):
            k = _kind_of(e, {}, cache)
            if k:
                seq_kind.setdefault(e.sequence_nr, k)
    cache = {}
    by_kind, by_op, by_kind_bytes = {}, {}, {}
    for e in events:
        kind = _kind_of(e, seq_kind, cache)
        phase = _phase_of(e)
        if not kind:
            kind = "optimizer" if phase == "optimizer" else ("host code" if e.name.startswith("phase:") else "other ops")
        s = e.self_cpu_time_total / 1e6
        by_kind[(phase, kind)] = by_kind.get((phase, kind), 0.0) + s
        b = _operand_bytes(e)
        by_kind_bytes[(phase, kind)] = by_kind_bytes.get((phase, kind), 0.0) + b
        is_op = not e.name.startswith(("phase:", "cat:"))
        key = (kind, e.name if is_op else f"(code in {e.name})")
        a = by_op.setdefault(key, [0.0, 0, 0.0])
        a[0] += s
        a[1] += 1
        a[2] += b
    steps = max(timer.steps, 1)
    return {"phases": {p: {"cpu_s": timer.cpu[p] / steps, "wall_s": timer.wall[p] / steps} for p in timer.cpu},
            "by_kind": [{"phase": p, "kind": k, "wall_s": v / steps, "bytes": by_kind_bytes.get((p, k), 0.0) / steps}
                        for (p, k), v in by_kind.items()],
            "by_op": [{"kind": k, "op": o, "wall_s": v[0] / steps, "calls": v[1] / steps, "bytes": v[2] / steps}
                      for (k, o), v in by_op.items()]}
