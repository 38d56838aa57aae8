"""The demo pair as the demo, the tests and the benchmarks use it: the shipped weights.

``demo/weights/`` holds the trained draft and target (safetensors, tokenizers, chat templates) and
``report.json`` (the recipe key they were trained under, each file's sha256, the training and
evaluation numbers). Every machine runs these same weights; nothing is trained at install. What is
built *from* them (the draft's ONNX export, its INT8 model: ``coinfer.demo.artifacts``) goes to a cache
directory keyed by the weights' digests, under ``$XDG_CACHE_HOME/coinfer/models/`` (default
``~/.cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from coinfer.demo.train import SHIPPED, file_digests


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "coinfer" / "models"


class ShippedWeightsError(RuntimeError):
    """The shipped pair is missing or does not match its report (a partial checkout, a LFS pointer)."""


@dataclass
class DemoModels:
    """Paths of the model pair and its report; ``root`` is the cache directory for what is built from it."""

    root: Path
    draft: Path
    target: Path
    report: dict


def ensure_models(weights: Path = SHIPPED, verify: bool = True) -> DemoModels:
    """The pair at ``weights`` (default: the shipped one), its files checked against the report's
    digests (~0.1 s), and its artefact cache directory (created)."""
    report_path = weights / "report.json"
    if not report_path.exists():
        raise ShippedWeightsError(f"{report_path} is missing: the demo pair is trained with `make models`")
    report = json.loads(report_path.read_text())
    if verify:
        found = file_digests(weights)
        bad = sorted(k for k, v in report["files"].items() if found.get(k) != v)
        if bad:
            raise ShippedWeightsError(f"{weights}: files differ from report.json: {', '.join(bad)}")
    pair_id = hashlib.sha256(json.dumps(report["files"], sort_keys=True).encode()).hexdigest()[:16]
    root = cache_root() / f"pair-{pair_id}"
    root.mkdir(parents=True, exist_ok=True)
    return DemoModels(root, weights / "draft", weights / "target", report)
