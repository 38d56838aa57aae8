"""Build-once artefacts of the demo (``python -m coinfer.demo.artifacts`` builds them): the trained models and the draft's ONNX export.

The models are the shipped pair (``coinfer.demo.models``); what is built from them lives in the cache
directory keyed by the weights' digests, so the demo, the tests and CI share one build.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from coinfer.demo.models import DemoModels, ensure_models
from coinfer.quantize.artifact import EXPORT_SOURCES
from coinfer.quantize.artifact import source_key as artifact_key

log = logging.getLogger(__name__)


@dataclass
class DemoArtifacts:
    models: DemoModels
    draft_onnx: Path
    """Directory with model.onnx + tokenizer (FP32 export of the draft)."""

    @property
    def target(self) -> Path:
        return self.models.target

    @property
    def draft_int8(self) -> Path:
        """The edge's default draft: INT8 static (QDQ), gated against the FP32 export (built once).

        Static, not dynamic: dynamic quantization scales activations per tensor, i.e. over the
        whole batch, so a draft's tokens depend on its batch-mates (43/48 drafts identical to
        per-draft runs, measured); static scales are calibrated constants and weight-only scales
        activations per row, both exactly batch-invariant (48/48)."""
        out = self.models.root / f"draft-int8-static-{artifact_key(INT8_SOURCES)}"
        if not (out / "manifest.json").exists():
            _drop_stale(self.models.root, "draft-int8-static", out)
            from coinfer.quantize.build import BuildOptions, int8_dir
            from coinfer.quantize.int8 import QuantConfig

            shutil.rmtree(out, ignore_errors=True)
            log.info("quantizing the draft model (INT8 static): %s", out)
            calib, gated = self.models.root / "calibration.jsonl", self.models.root / "gate-prompts.jsonl"
            write_prompts(calib, held_out=False)
            write_prompts(gated, held_out=True, seed=2)
            int8_dir(
                self.draft_onnx,
                out,
                QuantConfig(scheme="static"),
                BuildOptions(calibration_file=calib, gate_prompts=gated),
            )
        return out


def write_prompts(path: Path, n: int = 48, seed: int = 1, held_out: bool = False) -> None:
    """What the demo draft drafts for, as a quantize prompt file: word problems (open requests, no
    task) as well as the two presets (graded). The train side calibrates static INT8 (ranges fitted
    on the presets alone clip the word problems'), the held-out side gates it."""
    import random

    from coinfer.demo import wordprob
    from coinfer.tasks import problems

    rng = random.Random(seed)
    words, presets = wordprob.problems(rng, held_out=held_out), problems(rng, ("arith", "select"), held_out=held_out)
    lines = []
    for i in range(n):
        if i % 2 == 0:
            lines.append({"prompt": next(words).prompt})
        else:
            p = next(presets)
            lines.append({"task": p.task, "prompt": p.prompt})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def parity_prompt(model_dir: Path) -> list[int]:
    """Token ids of a real chat-rendered arith prompt (the ids the edge feeds the export)."""
    from transformers import AutoTokenizer

    from coinfer.chat import ChatFormat, ChatMessage

    text = ChatFormat.from_dir(model_dir).render([ChatMessage("user", "If x=3 and y=5, compute (x+y)^2-x*y.")])
    return AutoTokenizer.from_pretrained(str(model_dir))(text, add_special_tokens=False)["input_ids"]


# The code that builds each artefact is part of its cache key (beside the models' recipe key of the
# directory above): a change to the exporter or the quantizer is re-exercised on a warm cache.
INT8_SOURCES = (*EXPORT_SOURCES, "quantize/*.py", "demo/artifacts.py")


STALE_AFTER_S = 24 * 3600
"""Another key's artefact is removed once it is this old: younger, it may be another checkout's in use
(a CI clone beside a working tree shares the cache; removing its export failed 22 of its tests)."""


def _drop_stale(root: Path, prefix: str, keep: Path, now: float | None = None) -> None:
    """Artefacts built by other code (and the unkeyed name of earlier builds) are not reused: remove
    those older than ``STALE_AFTER_S`` (a few MB each)."""
    now = time.time() if now is None else now
    for old in root.glob(f"{prefix}*"):
        if old != keep and old.is_dir() and now - old.stat().st_mtime > STALE_AFTER_S:
            shutil.rmtree(old, ignore_errors=True)


def ensure_artifacts() -> DemoArtifacts:
    models = ensure_models()
    onnx_dir = models.root / f"draft-onnx-fp32-{artifact_key(EXPORT_SOURCES)}"
    if not (onnx_dir / "manifest.json").exists():
        _drop_stale(models.root, "draft-onnx-fp32", onnx_dir)
        from coinfer.quantize.export import export_dir

        shutil.rmtree(onnx_dir, ignore_errors=True)  # an export from before manifests existed

        log.info("exporting the draft model to ONNX: %s", onnx_dir)
        export_dir(models.draft, onnx_dir, parity_prompt=parity_prompt(models.draft))
    return DemoArtifacts(models, onnx_dir)


def main() -> int:
    """Build (or reuse) the draft's ONNX export and INT8 model from the shipped pair; print their paths."""
    import sys

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    art = ensure_artifacts()
    print(f"draft ONNX: {art.draft_onnx}\ndraft INT8: {art.draft_int8}\ntarget: {art.target}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
