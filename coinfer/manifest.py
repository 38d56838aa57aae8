"""Model artefact manifests: written by the quantize CLI, verified by the edge loader.

``manifest.json`` lists the sha256 and size of every file in the model
directory plus what produced it (scheme, source model hash, tokenizer hash,
intended execution providers, check results). A tampered, truncated or
mismatched file is refused with an error naming the file; a directory without a
manifest is refused unless the caller explicitly allows unverified models.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT, VERSION = "coinfer-model", 1


class ManifestError(ValueError):
    """The artefact cannot be trusted; the message names the file."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(model_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Hash every regular file of ``model_dir`` and write ``manifest.json`` beside them."""
    files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
             for p in sorted(model_dir.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {"format": FORMAT, "version": VERSION, **meta, "files": files}
    (model_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def verify_manifest(model_dir: Path, allow_unverified: bool = False) -> dict[str, Any] | None:
    """Check every listed file's size and sha256; returns the manifest (None if allowed-missing)."""
    path = model_dir / MANIFEST
    if not path.is_file():
        if allow_unverified:
            return None
        raise ManifestError(f"{path}: missing; refusing an unverified model (allow unverified models explicitly "
                            "to load it anyway)")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError("not a coinfer model manifest")
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{path}: unreadable manifest: {exc}") from None
    for name, entry in files.items():
        f = model_dir / name
        if "/" in name or name.startswith("."):
            raise ManifestError(f"{path}: file name {name!r} escapes the model directory")
        if not f.is_file():
            raise ManifestError(f"{f}: listed in the manifest but missing")
        size = f.stat().st_size
        if size != entry.get("bytes"):
            raise ManifestError(f"{f}: {size} bytes, manifest says {entry.get('bytes')} (truncated or replaced)")
        if sha256_file(f) != entry.get("sha256"):
            raise ManifestError(f"{f}: sha256 mismatch with the manifest (tampered or corrupt)")
    checks = manifest.get("checks") or {}
    if checks.get("passed") is False and not allow_unverified:
        raise ManifestError(f"{path}: this model failed its build checks ({_first_failure(checks)}); "
                            "allow unverified models explicitly to load it anyway")
    return manifest


def _first_failure(checks: dict[str, Any]) -> str:
    problems = (checks.get("structure") or {}).get("problems") or []
    if problems:
        return f"structure: {problems[0]}"
    for g in (checks.get("gates") or {}).get("gates") or []:
        if not g.get("passed", True):
            return g.get("message", g.get("name", "gate"))
    par = checks.get("parity") or {}
    if par.get("greedy_match") is False:
        return f"parity: greedy path differs from torch (max logit diff {par.get('max_logit_diff', 0):.2e})"
    return "see manifest.json"
