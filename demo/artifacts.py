"""Build-once artefacts of the demo: the trained models and the draft's ONNX export.

Everything lives under the recipe-keyed cache directory of ``demo.train``, so
the demo, the tests and CI share one build.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from demo.train import DemoModels, Recipe, ensure_models

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
        out = self.models.root / "draft-int8-static"
        if not (out / "manifest.json").exists():
            from quantize.build import BuildOptions, int8_dir
            from quantize.int8 import QuantConfig

            shutil.rmtree(out, ignore_errors=True)
            log.info("quantizing the draft model (INT8 static): %s", out)
            calib = self.models.root / "calibration.jsonl"
            write_calibration(calib)
            int8_dir(self.draft_onnx, out, QuantConfig(scheme="static"), BuildOptions(calibration_file=calib))
        return out


def write_calibration(path: Path, n: int = 48, seed: int = 1) -> None:
    """Static INT8 calibration prompts from the train split of what the edge drafts for: word
    problems (open requests, no task) as well as the two presets -- activation ranges fitted on
    the presets alone clip the word problems' (the quantize CLI's default draws presets only)."""
    import random

    from coinfer.tasks import problems
    from demo import wordprob

    rng = random.Random(seed)
    words, presets = wordprob.problems(rng, held_out=False), problems(rng, ("arith", "select"), held_out=False)
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


def ensure_artifacts(recipe: Recipe | None = None) -> DemoArtifacts:
    models = ensure_models(recipe)
    onnx_dir = models.root / "draft-onnx-fp32"
    if not (onnx_dir / "manifest.json").exists():
        from quantize.export import export_dir

        shutil.rmtree(onnx_dir, ignore_errors=True)  # an export from before manifests existed

        log.info("exporting the draft model to ONNX: %s", onnx_dir)
        export_dir(models.draft, onnx_dir, parity_prompt=parity_prompt(models.draft))
    return DemoArtifacts(models, onnx_dir)
