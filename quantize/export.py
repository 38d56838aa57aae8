"""Export a Hugging Face decoder-only causal LM to ONNX with a KV cache.

One graph for prefill and decode (see ``decoder_graph``), exported with PyTorch's
dynamo-based exporter, checked with ``onnx.checker`` and against torch on the
KV-cache path (prefill + decode steps): max logit difference and greedy match.
FP16 is the FP32 graph converted by ONNX Runtime's float16 converter (weights,
cache and logits in fp16): exporting from an fp16 torch model on a CPU would
trace CPU fp16 kernels that do not exist.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from coinfer.edge.onnx_lm import KV_CACHE_KEY, OnnxLM
from coinfer.manifest import sha256_file, write_manifest
from coinfer.quantize.artifact import (
    EXTERNAL_DATA_BYTES,
    MODEL_FILE,
    ArtifactError,
    copy_sidecars,
    data_file,
    has_external_data,
    opset_of,
    save_model,
    staged,
    tokenizer_hash,
)
from coinfer.quantize.decoder_graph import KV_CACHES, ExportDecoder, io_names, refusal

log = logging.getLogger(__name__)
SUPPORTED = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
)
"""Decoder-only families the export graph states exactly (``quantize/decoder_graph.py``): Llama (GQA,
tied embeddings, Llama 3 / linear / YaRN rope scaling; SmolLM2), Qwen2/2.5 (qkv bias), Qwen3 (q/k norm),
Mistral and Phi-3 (sliding window, fused qkv / gate_up), Gemma 2 (soft-capping, sandwich norms,
alternating sliding window), Gemma 3 text (per-head (1 + w) q/k norms, 5:1 local / global layers, the
local layers' own rotary base; Gemma 2's soft-capping where the config sets it)."""
DTYPES = ("fp32", "fp16")


def _source_hash(model_dir: Path) -> str:
    """One hash over the source model's config and weight files (names + contents)."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(model_dir.iterdir()):
        if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name == "config.json"):
            h.update(p.name.encode())
            h.update(sha256_file(p).encode())
    return h.hexdigest()


class ExportError(ArtifactError):
    """The source model cannot be exported (message names the file or field)."""


def load_source(model_dir: Path) -> PreTrainedModel:
    """Load a supported HF causal LM, with errors that say what is wrong."""
    cfg_path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise ExportError(f"{model_dir}: not a directory")
    if not cfg_path.is_file():
        raise ExportError(f"{cfg_path}: missing; not a Hugging Face model directory")
    try:
        cfg = AutoConfig.from_pretrained(str(model_dir))
    except Exception as exc:  # transformers raises several types here
        raise ExportError(f"{cfg_path}: unreadable config: {exc}") from None
    archs = getattr(cfg, "architectures", None) or []
    if not any(a in SUPPORTED for a in archs):
        raise ExportError(
            f"{cfg_path}: architecture {archs or cfg.model_type!r} unsupported (supported: {', '.join(SUPPORTED)})"
        )
    if why := refusal(cfg):
        raise ExportError(f"{cfg_path}: {why}")
    # eager attention: the reference parity compares against (SDPA skips Gemma 2's soft-capping)
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager").eval()


@dataclass
class Parity:
    """Torch vs ONNX on the KV-cache path."""

    max_logit_diff: float
    greedy_match: bool
    decode_steps: int


def _sample_inputs(model: ExportDecoder, batch: int, past: int, new: int) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(4, 50, (batch, new))
    mask = torch.ones(batch, past + new, dtype=torch.long)
    pos = torch.arange(past, past + new)[None].expand(batch, new)
    kv = [torch.randn(batch, model.num_kv_heads, past, model.head_dim) for _ in range(2 * model.num_layers)]
    return (ids, mask, pos, *kv)


def export_onnx(
    hf: PreTrainedModel,
    out_path: Path,
    opset: int = 18,
    all_logits: bool = False,
    external_data: bool | None = None,
    kv_cache: str = "concat",
) -> None:
    """Export the loaded source model to ``out_path`` (FP32); logits of the last position only unless
    ``all_logits``. Weights go to ``model.onnx.data`` when ``external_data`` (None: when they exceed
    ``EXTERNAL_DATA_BYTES``; a single protobuf file cannot hold more than 2 GiB). ``kv_cache``
    "buffer": attention as GroupQueryAttention over a cache the runtime may preallocate."""
    if external_data is None:
        external_data = sum(p.numel() * 4 for p in hf.parameters()) > EXTERNAL_DATA_BYTES
    m = ExportDecoder(hf, all_logits=all_logits, kv_cache=kv_cache).eval()
    table = None
    if kv_cache == "buffer":
        from coinfer.quantize import contrib_ops, gqa_op

        table = {**gqa_op.translation_table(), **contrib_ops.translation_table()}
    inputs, outputs = io_names(m.num_layers)
    # Dim.AUTO: the mask length is past + new, a relation torch.export infers itself
    # (a Dim sum of two named dims cannot be declared). *past is one pytree element.
    auto = torch.export.Dim.AUTO
    shapes = [
        {0: auto, 1: auto},
        {0: auto, 1: auto},
        {0: auto, 1: auto},
        tuple({0: auto, 2: auto} for _ in range(2 * m.num_layers)),
    ]
    sample = _sample_inputs(m, batch=2, past=3, new=2)
    with torch.no_grad():
        prog = torch.onnx.export(
            m,
            sample,
            dynamo=True,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=shapes,
            opset_version=opset,
            external_data=external_data,
            custom_translation_table=table,
            optimize=True,
            verbose=False,
        )
    prog.model.metadata_props[KV_CACHE_KEY] = kv_cache  # how the runtime feeds the cache (edge.onnx_lm)
    prog.save(str(out_path), external_data=external_data)
    if external_data and not data_file(out_path).exists():  # the exporter names it; the edge expects this name
        raise ExportError(f"{out_path}: the exporter wrote its weights elsewhere than {data_file(out_path).name}")
    onnx.checker.check_model(str(out_path), full_check=True)


def parity(hf: PreTrainedModel, onnx_path: Path, prompt_ids: list[int], steps: int = 16) -> Parity:
    """Greedy decode ``steps`` tokens with torch (HF, full recompute) and feed the same tokens to
    ONNX Runtime one by one on its KV path; compare the logits at every position."""
    ids = list(prompt_ids)
    ref = []
    with torch.no_grad():
        for _ in range(steps + 1):
            # the head on the last position only: a 262k vocabulary over a 528-token prompt is 0.5 GB a step
            ref.append(hf(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].numpy())
            ids.append(int(ref[-1].argmax()))
    got = OnnxLM(onnx_path, providers=["CPUExecutionProvider"]).forced(list(prompt_ids), ids[len(prompt_ids) :])
    max_diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got))
    match = all(int(a.argmax()) == int(b.argmax()) for a, b in zip(ref, got))
    return Parity(max_diff, match, steps)


def to_fp16(src: Path, dst: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from coinfer.quantize.contrib_ops import drop_unread_statistics

    external = has_external_data(src)
    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=False, disable_shape_infer=True)
    drop_unread_statistics(model.graph)  # the buffer graph's fused norms: float-only outputs, never read
    save_model(model, dst, external)
    onnx.checker.check_model(str(dst), full_check=True)


def providers(dtype: str, kv_cache: str) -> list[str]:
    """Where the export is meant to run (the manifest records it; ``check --providers`` verifies).

    The buffer graph's GroupQueryAttention has a CUDA kernel for float16 and bfloat16 only: in a
    float32 graph (and an INT8 one made from it, whose activations stay float32) ONNX Runtime runs
    each layer's attention on the CPU, with a copy each way per layer per step (measured on an H200:
    134M model at batch 5, 12-13 ms a step against FP16's 2-3 ms). On CUDA, export it in FP16."""
    if kv_cache == "buffer" and dtype == "fp32":
        return ["CPUExecutionProvider"]
    return ["CPUExecutionProvider", "CUDAExecutionProvider"]


class ParityFailed(ExportError):
    """The export disagrees with torch: nothing was published (unless kept, marked failed)."""

    def __init__(self, report: dict) -> None:
        super().__init__("; ".join(report["failures"]))
        self.report = report


def export_dir(
    model_dir: Path,
    out_dir: Path,
    parity_prompt: list[int] | None = None,
    parity_steps: int = 16,
    dtype: str = "fp32",
    keep_failed: bool = False,
    all_logits: bool = False,
    external_data: bool | None = None,
    kv_cache: str = "concat",
) -> dict:
    """Export to ``out_dir`` (model.onnx + tokenizer + export.json + manifest.json), atomically.

    A failed parity check (greedy path differs from torch's) publishes nothing and raises
    ParityFailed; with ``keep_failed`` the artefact is published with ``checks.passed: false`` in
    its manifest, which the edge loader refuses unless unverified models are allowed."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype: unknown {dtype!r} (known: {', '.join(DTYPES)})")
    if kv_cache not in KV_CACHES:
        raise ExportError(f"kv_cache: unknown {kv_cache!r} (known: {', '.join(KV_CACHES)})")
    hf = load_source(model_dir)  # once; bad input fails before a temp dir exists
    with staged(out_dir) as tmp:
        _export_graph(hf, tmp, dtype, all_logits=all_logits, external_data=external_data, kv_cache=kv_cache)
        copy_sidecars(model_dir, tmp)
        report: dict = {
            "source": str(model_dir),
            "precision": dtype,
            "logits": "all" if all_logits else "last",
            "kv_cache": kv_cache,
        }
        if parity_prompt is not None:
            report["parity"] = asdict(parity(hf, tmp / MODEL_FILE, parity_prompt, parity_steps))
        par = report.get("parity")
        report["failures"] = [_parity_failure(par)] if par and not par["greedy_match"] else []
        (tmp / "export.json").write_text(json.dumps(report, indent=2))
        write_manifest(
            tmp,
            {
                "scheme": dtype,
                "opset": opset_of(tmp / MODEL_FILE),
                "source": {"path": str(model_dir), "sha256": _source_hash(model_dir)},
                "tokenizer_sha256": tokenizer_hash(tmp),
                "providers": providers(dtype, kv_cache),
                "checks": {"parity": report.get("parity"), "passed": not report["failures"]},
            },
        )
        if report["failures"] and not keep_failed:
            raise ParityFailed(report)
    return report


def _export_graph(hf, tmp: Path, dtype: str, **kw) -> None:
    """The ONNX graph of ``hf`` as ``tmp``'s model file, in ``dtype`` (``kw``: ``export_onnx``'s options)."""
    if dtype != "fp16":
        export_onnx(hf, tmp / MODEL_FILE, **kw)
        return
    (tmp / ".fp32").mkdir()  # the fp32 graph (and its weights file) in a scratch dir, never published
    export_onnx(hf, tmp / ".fp32" / MODEL_FILE, **kw)
    to_fp16(tmp / ".fp32" / MODEL_FILE, tmp / MODEL_FILE)
    shutil.rmtree(tmp / ".fp32")


def _parity_failure(par: dict) -> str:
    return (
        f"parity: greedy path differs from torch within {par['decode_steps']} decode steps "
        f"(max logit diff {par['max_logit_diff']:.2e})"
    )
