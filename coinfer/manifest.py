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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MANIFEST = "manifest.json"
FORMAT, VERSION = "coinfer-model", 1


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class Manifest(BaseModel):
    """What a loader relies on; the build's own records (scheme, checks, ...) ride along unchecked
    except ``checks``, whose ``passed`` decides whether a model may load."""

    model_config = ConfigDict(extra="allow")
    format: Literal["coinfer-model"]
    version: Literal[1]
    files: dict[str, FileEntry] = Field(min_length=1)
    checks: dict[str, Any] | None = None

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in files:  # a listed name may not point outside the model directory
            if not name or "/" in name or "\\" in name or name.startswith(".") or name == MANIFEST:
                raise ValueError(f"file name {name!r} escapes the model directory")
        return files


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
    files = {
        p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"format": FORMAT, "version": VERSION, **meta, "files": files}
    (model_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def verify_manifest(model_dir: Path, allow_unverified: bool = False) -> dict[str, Any] | None:
    """Check every listed file's size and sha256; returns the manifest (None if allowed-missing)."""
    path = model_dir / MANIFEST
    if not path.is_file():
        if allow_unverified:
            return None
        raise ManifestError(
            f"{path}: missing; refusing an unverified model (allow unverified models explicitly to load it anyway)"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        schema = Manifest.model_validate(manifest)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "manifest"
        raise ManifestError(f"{path}: invalid manifest: {where}: {err['msg']}") from None
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise ManifestError(f"{path}: unreadable manifest: {str(exc)[:200]}") from None
    for name, entry in schema.files.items():
        f = model_dir / name
        if not f.is_file():
            raise ManifestError(f"{f}: listed in the manifest but missing")
        size = f.stat().st_size
        if size != entry.bytes:
            raise ManifestError(f"{f}: {size} bytes, manifest says {entry.bytes} (truncated or replaced)")
        if sha256_file(f) != entry.sha256:
            raise ManifestError(f"{f}: sha256 mismatch with the manifest (tampered or corrupt)")
    checks = manifest.get("checks") or {}
    if checks.get("passed") is False and not allow_unverified:
        raise ManifestError(
            f"{path}: this model failed its build checks ({_first_failure(checks)}); "
            "allow unverified models explicitly to load it anyway"
        )
    return manifest


def identity(model_dir: Path, manifest: dict[str, Any] | None) -> str:
    """A model artefact's identity for others to key by, never a path: the digest of its manifest's file list
    (every file's sha256 and size: the same bytes give the same identity on every machine); an unverified
    directory without a manifest, the digest of its resolved path (stable on this machine only)."""
    if manifest is not None:
        files = json.dumps(manifest.get("files", {}), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(files.encode()).hexdigest()
    return "path-sha256:" + hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()


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
