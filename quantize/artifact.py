"""Model artefact directories: built in a temp dir beside the target, renamed into place at the end.

A crash, a bad input or a failed check leaves nothing at the output path that
could be mistaken for a valid model.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx

from coinfer.manifest import sha256_file

MODEL_FILE = "model.onnx"
EXTERNAL_DATA_BYTES = 1 << 30
"""Weights go to ``model.onnx.data`` beside the graph above this many bytes: one protobuf file cannot
exceed 2 GiB, and a model that grows past it in a later step (calibration's augmented graph, a
converter's copy) must not fail there."""
# copied beside the model: what the edge needs to tokenize and stop (not the weights)
SIDECAR_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
)


_ROOT = Path(__file__).resolve().parents[1]
EXPORT_SOURCES = (
    "quantize/export.py",
    "quantize/decoder_graph.py",
    "quantize/gqa_op.py",
    "quantize/contrib_ops.py",
    "quantize/artifact.py",
    "edge/onnx_lm.py",
    "coinfer/manifest.py",
)
"""The code an ONNX export depends on: part of the cache key of every cached export (demo, real model)."""


def source_key(patterns: tuple[str, ...]) -> str:
    """Short hash of the repository's source files matching ``patterns`` (paths and contents): a cached
    artefact keyed by it is rebuilt when the code that builds it changes."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted({f for pattern in patterns for f in _ROOT.glob(pattern)}):
        h.update(str(p.relative_to(_ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


class ArtifactError(ValueError):
    """Bad input to a build (missing source, existing output, unusable model); the message names the path."""


@contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """Yield a fresh temp dir; rename it to ``out_dir`` if the block succeeds, else delete it."""
    if out_dir.exists():
        raise ArtifactError(f"{out_dir}: output directory exists")
    if not out_dir.parent.is_dir():
        raise ArtifactError(f"{out_dir.parent}: parent of the output directory does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        yield tmp
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def copy_sidecars(src_dir: Path, dst_dir: Path) -> None:
    for name in SIDECAR_FILES:
        if (src_dir / name).exists():
            shutil.copy2(src_dir / name, dst_dir / name)


def tokenizer_hash(model_dir: Path) -> str | None:
    return sha256_file(model_dir / "tokenizer.json") if (model_dir / "tokenizer.json").exists() else None


def model_file(model_dir: Path) -> Path:
    """``model_dir/model.onnx``, or a clear error."""
    path = model_dir if model_dir.suffix == ".onnx" or model_dir.is_file() else model_dir / MODEL_FILE
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; expected a model directory from `export`")
    return path


def load_checked(path: Path) -> onnx.ModelProto:
    """The ONNX graph at ``path`` (weights not loaded), or ArtifactError if it is not a usable one."""
    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(str(path))  # by path: external weights are found beside the graph
    except Exception as exc:  # DecodeError, ValidationError, ...: all mean "not a usable ONNX file"
        raise ArtifactError(f"{path}: not a valid ONNX model ({type(exc).__name__}: {str(exc)[:200]})") from None
    return model


def opset_of(path: Path) -> int | None:
    """The default-domain opset of the model at ``path`` (for the manifest)."""
    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def data_file(path: Path) -> Path:
    """Where a model's external weights live (``model.onnx`` -> ``model.onnx.data``)."""
    return path.with_name(path.name + ".data")


def has_external_data(path: Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer)


def model_bytes(path: Path) -> int:
    """Size of a model: its graph file and its external weights."""
    return path.stat().st_size + (data_file(path).stat().st_size if data_file(path).exists() else 0)


def save_model(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """Save ``model`` (weights loaded) to ``path``; with ``external`` its weights go to one
    ``data_file`` beside it, replacing any (onnx appends to an existing one)."""
    data_file(path).unlink(missing_ok=True)
    onnx.save(
        model,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=data_file(path).name,
        size_threshold=1024,
    )
