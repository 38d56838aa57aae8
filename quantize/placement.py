"""Which nodes of a model run on which execution provider, and where an accelerator fell back to CPU.

ONNX Runtime assigns providers at session creation (after graph optimisation
and fusion). Its profiler records, for every kernel that ran, the provider that
ran it; one decode step with a real cache is enough to see the placement of the
graph that the edge actually runs.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from coinfer.edge.onnx_lm import ACCELERATORS, OnnxLM

# ops that carry the model's arithmetic: on CPU while CUDA / TensorRT was asked for = a real fallback
COMPUTE_OPS = (
    "MatMul",
    "Gemm",
    "Attention",
    "Softmax",
    "LayerNorm",
    "SimplifiedLayerNorm",
    "SkipSimplifiedLayerNorm",
    "RotaryEmbedding",
    "QLinear",
    "DequantizeLinear",
    "QuantizeLinear",
    "DynamicQuantize",
    "FusedMatMul",
)


PLACEMENT_TOKENS = 8
"""Cache positions of the placement run: a 4-token prefill and a decode step, with room to spare."""


@dataclass
class Placement:
    requested: list[str]
    available: list[str]
    session: list[str]
    """Providers the session actually registered (ORT drops unavailable ones)."""
    nodes: dict[str, int] = field(default_factory=dict)
    """Kernel count per provider over one prefill and one decode step."""
    by_op: dict[str, dict[str, int]] = field(default_factory=dict)
    fallback: list[str] = field(default_factory=list)
    """Compute nodes on CPU although an accelerator was requested (op: node names)."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


HINTS = {
    "GroupQueryAttention": " (its CUDA kernel takes float16 and bfloat16 only: export with --dtype fp16)",
}
"""What to do about an op that falls back in a float32 graph, by op."""


def is_compute(op: str) -> bool:
    return any(p in op for p in COMPUTE_OPS)


def check_placement(model_path: Path, providers: list[str]) -> Placement:
    available = ort.get_available_providers()
    unknown = [p for p in providers if p not in ort.get_all_providers()]
    if unknown:
        raise ValueError(f"providers: unknown {', '.join(unknown)} (known: {', '.join(ort.get_all_providers())})")
    res = Placement(requested=list(providers), available=available, session=[])
    accel = [p for p in providers if p in ACCELERATORS]
    for p in accel:
        if p not in available:
            res.problems.append(
                f"{p} requested but this onnxruntime build does not have it (available: "
                f"{', '.join(available)}); install onnxruntime-gpu, not onnxruntime, on GPU boxes"
            )
    lm = OnnxLM(
        model_path, providers=[p for p in providers if p in available] or ["CPUExecutionProvider"], profile=True
    )
    res.session = lm.providers
    # a buffer graph's cache holds the prefill and the decode step (the CUDA kernel of GroupQueryAttention
    # refuses a zero-capacity one: "seqlens_k[0] = 3 is out of range [0, 0)" on an H200); concat ignores it
    logits, past = lm.step(np.array([[1, 2, 3, 4]], np.int64), lm.empty_past(PLACEMENT_TOKENS))
    lm.step(logits.argmax(-1, keepdims=True).astype(np.int64), past)
    prof = lm.session.end_profiling()
    try:
        events = json.loads(Path(prof).read_text())
    finally:
        os.unlink(prof)
    per_node: dict[str, tuple[str, str]] = {}
    for ev in events:
        args = ev.get("args") or {}
        if ev.get("cat") == "Node" and "provider" in args and ev.get("name", "").endswith("_kernel_time"):
            per_node[ev["name"].removesuffix("_kernel_time")] = (args.get("op_name", "?"), args["provider"])
    by_op: dict[str, Counter] = {}
    for op, prov in per_node.values():
        by_op.setdefault(prov, Counter())[op] += 1
    res.by_op = {p: dict(c) for p, c in by_op.items()}
    res.nodes = {p: sum(c.values()) for p, c in by_op.items()}
    if accel:
        res.fallback = sorted(
            f"{op}: {name}"
            for name, (op, prov) in per_node.items()
            if prov == "CPUExecutionProvider" and is_compute(op)
        )
        if res.fallback and not res.problems:
            res.problems.append(
                f"{len(res.fallback)} compute node(s) fell back to CPU although "
                f"{', '.join(accel)} was requested, e.g. {res.fallback[0]}"
                + (HINTS.get(res.fallback[0].split(":")[0], "") if lm.dtype == np.float32 else "")
            )
    return res
