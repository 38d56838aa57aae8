"""An estimate, not a measurement: the engine work an answer was counted to cost on this CPU, priced on a GPU.

    .venv/bin/python -m benchmarks.gpu_estimate REPORT.json [--batch 1 16 64] [--target llama-3.1-8b] [--gpu a100-80gb]
    .venv/bin/python -m benchmarks.gpu_estimate CAPACITY_RUN.json   # every workload and system of a capacity run

A roofline (issue 53 item 4): a decode step streams the target's weights and its batch's KV cache from memory
once, or is bound by its FLOPs where the batch is large enough; a prefill is bound by FLOPs at a stated
efficiency; every engine request pays a constant (scheduling, sampling, the step's launch). The counts are
``Summary.cost``'s (``coinfer.types.CloudCost``), per answer, as ``benchmarks.exact_split`` reports them
(``per_answer``), or every system's of a ``benchmarks.capacity`` run (``work_per_answer``: plain vLLM's from its
usage, the same names; a system whose server does not report its steps gets no latency floor): they were counted with the demo's pair (SmolLM2-135M drafting for itself), so priced with an
8B target they say what the same *counts* would cost there, not what an 8B pair would accept.

Per answer at a batch of ``B`` concurrent answers (the step's cost shared by the batch)::

    decode_s  = max(decode_steps * mem_step_s(B, context) / B, positions * 2 * params / peak_flops)
    prefill_s = (prompt_tokens - cached_tokens) * 2 * params / (peak_flops * prefill_efficiency)
    gpu_s     = decode_s + prefill_s + engine_requests * request_s
    latency_floor_s = steps * step_s(B, context)          (sequential steps: the answer's own wait)

``step_s(B, ctx) = max((weight_bytes + B * ctx * kv_bytes_per_token) / mem_bw, 2 * params * B / peak_flops)``;
``decode_steps`` and ``positions`` are ``decoded_tokens``, except where an answer's steps were fewer than its tokens
(drafts checked inside the engine's generation, ``EngineConfig.draft_speculative_tokens``, or samples decoded in
lockstep): then ``decode_steps = steps`` and ``positions`` adds the refused proposals (offered - accepted). With one
token a step this is ``decoded_tokens * step_s(B, context) / B``.

That prices a prefill as work of its own, after the decode steps: an upper bound. vLLM V1 schedules prefill chunks
into the decode steps (chunked prefill), where a memory-bound step has FLOPs to spare, so a second figure prices the
answer as the whole machine's roofline, the weights streamed once per shared decode step against every position's
FLOPs (a lower bound)::

    chunked_s = max(decode_steps * mem_step_s(B, context) / B,
                    positions * 2 * params / peak_flops + prefill_s)
                + engine_requests * request_s

(never above ``gpu_s``: ``max(a, b + c) <= max(a, b) + c``).

Parameters and their sources are in ``GPUS`` and ``MODELS`` (datasheets and the models' configs);
``PREFILL_EFFICIENCY`` and ``REQUEST_S`` are assumptions to be calibrated the first time a GPU is lent
(``benchmarks.gpu_check`` measures a decode step and a prefill on it). Labelled an estimate wherever printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

PREFILL_EFFICIENCY = 0.5
"""Share of peak tensor FLOPs a prefill of a few hundred tokens reaches: an assumption (published vLLM prefill
MFU for 8B models on A100 lies around 0.4-0.6), to be calibrated by ``benchmarks.gpu_check``."""
REQUEST_S = 0.002
"""Per engine request: scheduling, sampling, detokenizing, the first step's launch. An assumption (vLLM's
per-request CPU path is of the order of a millisecond or two), to be calibrated on a GPU."""


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """A GPU's roofline: memory bandwidth and dense 16-bit tensor throughput (datasheet values)."""

    name: str
    mem_bw_gbs: float
    peak_tflops: float
    source: str


@dataclass(frozen=True, kw_only=True)
class Model:
    """A target's size as a decode step reads it: its weights and its KV cache per token."""

    name: str
    params_b: float
    bytes_per_param: float
    layers: int
    kv_heads: int
    head_dim: int
    source: str

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V, every layer, 16-bit."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


GPUS = {
    "a100-80gb": Gpu(
        name="A100 80GB SXM", mem_bw_gbs=2039, peak_tflops=312, source="NVIDIA A100 datasheet (BF16 dense)"
    ),
    "h100-sxm": Gpu(name="H100 SXM", mem_bw_gbs=3350, peak_tflops=989, source="NVIDIA H100 datasheet (BF16 dense)"),
    "rtx-4090": Gpu(
        name="RTX 4090", mem_bw_gbs=1008, peak_tflops=165, source="Ada whitepaper (FP16 dense, FP32 accumulate)"
    ),
}
MODELS = {
    "llama-3.1-8b": Model(
        name="Llama 3.1 8B (BF16)",
        params_b=8.03,
        bytes_per_param=2,
        layers=32,
        kv_heads=8,
        head_dim=128,
        source="meta-llama/Llama-3.1-8B config.json",
    ),
    "qwen2.5-7b": Model(
        name="Qwen2.5 7B (BF16)",
        params_b=7.62,
        bytes_per_param=2,
        layers=28,
        kv_heads=4,
        head_dim=128,
        source="Qwen/Qwen2.5-7B config.json",
    ),
    "smollm2-135m": Model(
        name="SmolLM2 135M (BF16)",
        params_b=0.135,
        bytes_per_param=2,
        layers=30,
        kv_heads=3,
        head_dim=64,
        source="HuggingFaceTB/SmolLM2-135M-Instruct config.json",
    ),
}


def step_s(gpu: Gpu, model: Model, batch: int, context: float) -> float:
    """One decode step of ``batch`` sequences of ``context`` tokens each: memory- or compute-bound."""
    mem = (model.weight_bytes + batch * context * model.kv_bytes_per_token) / (gpu.mem_bw_gbs * 1e9)
    flops = 2 * model.params_b * 1e9 * batch / (gpu.peak_tflops * 1e12)
    return max(mem, flops)


def mem_step_s(gpu: Gpu, model: Model, batch: int, context: float) -> float:
    """One decode step's memory traffic alone: the weights once, the batch's KV cache."""
    return (model.weight_bytes + batch * context * model.kv_bytes_per_token) / (gpu.mem_bw_gbs * 1e9)


def prefill_s(gpu: Gpu, model: Model, positions: float) -> float:
    return positions * 2 * model.params_b * 1e9 / (gpu.peak_tflops * 1e12 * PREFILL_EFFICIENCY)


def per_answer(cost: dict, gpu: Gpu, model: Model, batch: int) -> dict:
    """Estimated GPU-seconds per answer (the batch shares each decode step) and the floor of its latency from
    its sequential steps, from one answer's mean counts ``cost`` (``CloudCost`` fields)."""
    decoded = cost["decoded_tokens"]
    context = cost.get("prompt_tokens", 0) / max(1, cost.get("engine_requests", 1)) + decoded
    steps = cost.get("steps")
    step = step_s(gpu, model, batch, context)
    # a step that writes several tokens (drafts checked inside the engine, samples in lockstep) streams the
    # weights once: the memory term counts steps, the FLOPs term every position computed, a refused proposal's too
    n_steps, positions = decoded, decoded
    if steps is not None and steps < decoded:
        n_steps = steps
        positions += max(0, cost.get("draft_tokens_offered", 0) - cost.get("draft_tokens_accepted", 0))
    mem, token_flops_s = mem_step_s(gpu, model, batch, context), 2 * model.params_b * 1e9 / (gpu.peak_tflops * 1e12)
    decode = max(n_steps * mem / batch, positions * token_flops_s)
    computed = cost.get("prompt_tokens", 0) - cost.get("cached_tokens", 0)
    prefill = prefill_s(gpu, model, computed)
    requests = cost["engine_requests"] * REQUEST_S
    chunked = max(  # decoding's FLOPs at peak as step_s prices them, the prefill's at PREFILL_EFFICIENCY
        n_steps * mem / batch,
        positions * token_flops_s + prefill,
    )
    return {
        "gpu_ms": round((decode + prefill + requests) * 1e3, 2),
        "decode_ms": round(decode * 1e3, 2),
        "prefill_ms": round(prefill * 1e3, 2),
        "requests_ms": round(requests * 1e3, 2),
        "gpu_ms_chunked": round((chunked + requests) * 1e3, 2),
        "latency_floor_ms": round(steps * step * 1e3, 1) if steps is not None else None,
    }


def estimate(per_plan: dict[str, dict], gpu: Gpu, model: Model, batches: list[int]) -> dict:
    """Per batch size and plan, ``per_answer``; split's GPU time and latency floor over the cloud plan's; and every
    other system's GPU time over split's (``split_capacity_over``: what the estimate says split serves per GPU-second
    over that system; ``_chunked``: with prefill riding in the decode steps)."""
    out = {"estimate": True, "gpu": gpu.name, "target": model.name, "batches": {}}
    for b in batches:
        row = {plan: per_answer(cost, gpu, model, b) for plan, cost in per_plan.items()}
        if {"split", "cloud"} <= row.keys():
            row["split_over_cloud_gpu"] = round(row["split"]["gpu_ms"] / row["cloud"]["gpu_ms"], 3)
            row["split_over_cloud_latency_floor"] = round(
                row["split"]["latency_floor_ms"] / row["cloud"]["latency_floor_ms"], 3
            )
        if "split" in row and row["split"]["gpu_ms"] > 0:
            row["split_capacity_over"] = {
                p: round(row[p]["gpu_ms"] / row["split"]["gpu_ms"], 3) for p in per_plan if p != "split"
            }
            row["split_capacity_over_chunked"] = {
                p: round(row[p]["gpu_ms_chunked"] / row["split"]["gpu_ms_chunked"], 3) for p in per_plan if p != "split"
            }
        out["batches"][b] = row
    return out


def _counted(work: dict) -> bool:
    return {"engine_requests", "decoded_tokens", "prompt_tokens"} <= work.keys()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_estimate", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "report", help="benchmarks.exact_split's output (its per_answer counts) or a benchmarks.capacity --json run"
    )
    ap.add_argument("--gpu", choices=list(GPUS), default="a100-80gb")
    ap.add_argument("--target", choices=list(MODELS), default="llama-3.1-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    args = ap.parse_args(argv)
    from benchmarks.capacity_runs import load

    try:
        (report,) = load([Path(args.report)])  # its last line: the benchmark's progress lines may precede it
    except json.JSONDecodeError:  # exact_split without --json: the object printed over several lines
        text = Path(args.report).read_text(encoding="utf-8")
        report = json.loads(text[text.index("{") :])
    gpu, model = GPUS[args.gpu], MODELS[args.target]
    if "workloads" in report:  # a capacity run: each workload's systems, those whose work was counted
        out = {
            wl: estimate(
                {s: e["work_per_answer"] for s, e in systems.items() if _counted(e.get("work_per_answer") or {})},
                gpu,
                model,
                args.batch,
            )
            for wl, systems in report["workloads"].items()
        }
    else:
        out = estimate(report["per_answer"], gpu, model, args.batch)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
