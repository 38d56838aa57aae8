"""Export a Hugging Face Llama-style causal LM to ONNX with a KV cache.

One graph for prefill and decode (see ``llama_graph``), exported with PyTorch's
dynamo-based exporter, checked with ``onnx.checker`` and against torch on the
KV-cache path (prefill + decode steps): max logit difference and greedy match.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from transformers import AutoConfig, LlamaForCausalLM

from coinfer.manifest import sha256_file, write_manifest
from quantize.llama_graph import ExportLlama, io_names

log = logging.getLogger(__name__)
SUPPORTED = ("LlamaForCausalLM",)
MODEL_FILE = "model.onnx"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "config.json")  # copied beside the model; not the manifest


def _source_hash(model_dir: Path) -> str:
    """One hash over the source model's config and weight files (names + contents)."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(model_dir.iterdir()):
        if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name == "config.json"):
            h.update(p.name.encode())
            h.update(sha256_file(p).encode())
    return h.hexdigest()


class ExportError(ValueError):
    """The source model cannot be exported (message names the file or field)."""


def load_source(model_dir: Path) -> LlamaForCausalLM:
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
        raise ExportError(f"{cfg_path}: architecture {archs or cfg.model_type!r} unsupported (supported: {', '.join(SUPPORTED)})")
    return LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()


@dataclass
class Parity:
    """Torch vs ONNX on the KV-cache path."""

    max_logit_diff: float
    greedy_match: bool
    decode_steps: int


def _sample_inputs(model: ExportLlama, batch: int, past: int, new: int) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(4, 50, (batch, new))
    mask = torch.ones(batch, past + new, dtype=torch.long)
    pos = torch.arange(past, past + new)[None].expand(batch, new)
    kv = [torch.randn(batch, model.num_kv_heads, past, model.head_dim) for _ in range(2 * model.num_layers)]
    return (ids, mask, pos, *kv)


def export_onnx(model_dir: Path, out_path: Path, opset: int = 18) -> None:
    """Export ``model_dir`` to ``out_path`` (FP32, single file)."""
    hf = load_source(model_dir)
    m = ExportLlama(hf).eval()
    inputs, outputs = io_names(m.num_layers)
    # Dim.AUTO: the mask length is past + new, a relation torch.export infers itself
    # (a Dim sum of two named dims cannot be declared). *past is one pytree element.
    auto = torch.export.Dim.AUTO
    shapes = [{0: auto, 1: auto}, {0: auto, 1: auto}, {0: auto, 1: auto},
              tuple({0: auto, 2: auto} for _ in range(2 * m.num_layers))]
    sample = _sample_inputs(m, batch=2, past=3, new=2)
    with torch.no_grad():
        prog = torch.onnx.export(m, sample, dynamo=True, input_names=inputs, output_names=outputs,
                                 dynamic_shapes=shapes, opset_version=opset, external_data=False,
                                 optimize=True, verbose=False)
    prog.save(str(out_path))
    onnx.checker.check_model(str(out_path), full_check=True)


def parity(model_dir: Path, onnx_path: Path, prompt_ids: list[int], steps: int = 16) -> Parity:
    """Greedy decode ``steps`` tokens with torch (HF) and ONNX Runtime (KV path); compare logits."""
    import onnxruntime as ort

    hf = load_source(model_dir)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    n_layers = hf.config.num_hidden_layers
    heads = hf.config.num_key_value_heads
    hd = getattr(hf.config, "head_dim", None) or hf.config.hidden_size // hf.config.num_attention_heads
    feed: dict[str, np.ndarray] = {f"past_key_values.{i}.{kv}": np.zeros((1, heads, 0, hd), np.float32)
                                   for i in range(n_layers) for kv in ("key", "value")}
    ids = list(prompt_ids)
    cur = np.array([ids], dtype=np.int64)
    max_diff, match = 0.0, True
    for _ in range(steps + 1):
        past_len = feed["past_key_values.0.key"].shape[2]
        feed.update(input_ids=cur, attention_mask=np.ones((1, past_len + cur.shape[1]), np.int64),
                    position_ids=np.arange(past_len, past_len + cur.shape[1], dtype=np.int64)[None])
        out = sess.run(None, feed)
        ort_logits = out[0][0, -1]
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0, -1].numpy()
        max_diff = max(max_diff, float(np.abs(ref - ort_logits).max()))
        nxt_ref, nxt = int(ref.argmax()), int(ort_logits.argmax())
        match &= nxt_ref == nxt
        ids.append(nxt_ref)
        cur = np.array([[nxt_ref]], dtype=np.int64)
        feed.update({f"past_key_values.{i // 2}.{('key', 'value')[i % 2]}": t for i, t in enumerate(out[1:])})
    return Parity(max_diff, match, steps)


def export_dir(model_dir: Path, out_dir: Path, parity_prompt: list[int] | None = None, parity_steps: int = 16) -> dict:
    """Export to ``out_dir`` (model.onnx + tokenizer + export.json), atomically."""
    if out_dir.exists():
        raise ExportError(f"{out_dir}: output directory exists")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        export_onnx(model_dir, tmp / MODEL_FILE)
        for name in TOKENIZER_FILES:
            if (model_dir / name).exists():
                shutil.copy2(model_dir / name, tmp / name)
        report: dict = {"source": str(model_dir), "precision": "fp32"}
        if parity_prompt is not None:
            report["parity"] = asdict(parity(model_dir, tmp / MODEL_FILE, parity_prompt, parity_steps))
        (tmp / "export.json").write_text(json.dumps(report, indent=2))
        write_manifest(tmp, {
            "scheme": "fp32", "opset": onnx.load(str(tmp / MODEL_FILE), load_external_data=False).opset_import[0].version,
            "source": {"path": str(model_dir), "sha256": _source_hash(model_dir)},
            "tokenizer_sha256": sha256_file(tmp / "tokenizer.json") if (tmp / "tokenizer.json").exists() else None,
            "providers": ["CPUExecutionProvider", "CUDAExecutionProvider"], "checks": {"parity": report.get("parity")},
        })
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report
