"""``int8``: an exported FP32 directory -> a checked, gated, manifested INT8 artefact."""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from coinfer.manifest import sha256_file, write_manifest
from coinfer.quantize.artifact import (
    MODEL_FILE,
    copy_sidecars,
    load_checked,
    model_bytes,
    model_file,
    opset_of,
    staged,
    tokenizer_hash,
)
from coinfer.quantize.check import check_structure, quantized_weights
from coinfer.quantize.gates import GateConfig, gate_dirs, gate_report
from coinfer.quantize.int8 import PROVIDERS, QuantConfig, quantize_model
from coinfer.quantize.prompts import TaskPrompt, default_prompts, halves, read_prompt_file

log = logging.getLogger(__name__)
OUTLIER_PROMPTS = 16
"""Prompts the ``keep_float=("auto",)`` outlier pass runs (prefill + 2 decode steps each)."""


@dataclass
class BuildOptions:
    gates: GateConfig | None = field(default_factory=GateConfig)
    """None skips the accuracy gates (the structure check always runs)."""
    calibration_file: Path | None = None
    """static: JSONL prompts to calibrate on (default: the even lines of ``gate_prompts`` when given,
    else the train side of the model's declared tasks or of the shipped generic set)."""
    gate_prompts: Path | None = None
    """Gates: JSONL chat requests (default: the held-out side of the model's declared tasks or of the
    shipped generic set; the odd lines only when calibration draws on the same file)."""
    keep_failed: bool = False
    """Publish the artefact even when a check fails (its manifest says so; the edge refuses it)."""
    progress: bool = True


class CheckFailed(RuntimeError):
    """A structure check or accuracy gate failed; ``report`` says which and by how much."""

    def __init__(self, report: dict) -> None:
        super().__init__("; ".join(report["failures"]))
        self.report = report


def calibration_prompts(src_dir: Path, cfg: QuantConfig, opts: BuildOptions) -> list[TaskPrompt]:
    if opts.calibration_file is not None:
        return read_prompt_file(opts.calibration_file)
    if opts.gate_prompts is not None:
        return halves(read_prompt_file(opts.gate_prompts), held_out=False)[: cfg.calib_prompts]
    return default_prompts(src_dir, cfg.calib_prompts, held_out=False, seed=1)


def gate_prompts(src_dir: Path, cfg: QuantConfig, opts: BuildOptions) -> list[TaskPrompt] | None:
    """The gates' prompts (None: ``gate_dirs``' default for the model)."""
    if opts.gate_prompts is None:
        return None
    prompts = read_prompt_file(opts.gate_prompts)
    shared = cfg.scheme == "static" and opts.calibration_file is None  # calibrated on the even lines
    return halves(prompts, held_out=True) if shared else prompts


def runs_on(scheme: str, src_dir: Path) -> list[str]:
    """The scheme's providers that its source graph runs on too (a source without a manifest, an
    Optimum export say, is taken to run wherever the scheme does)."""
    manifest = src_dir / "manifest.json"
    source = json.loads(manifest.read_text()).get("providers") if manifest.is_file() else None
    return [p for p in PROVIDERS[scheme] if source is None or p in source]


def int8_dir(src_dir: Path, out_dir: Path, cfg: QuantConfig = QuantConfig(), opts: BuildOptions | None = None) -> dict:
    """Quantize ``src_dir`` (from ``export``) into ``out_dir``; returns the report (raises CheckFailed)."""
    opts = opts or BuildOptions()
    cfg.validate()
    src = model_file(src_dir)
    load_checked(src)
    # bad files fail before any work
    prompts = calibration_prompts(src_dir, cfg, opts) if cfg.scheme == "static" else []
    gating = gate_prompts(src_dir, cfg, opts) if opts.gates is not None else None
    with staged(out_dir) as tmp:
        copy_sidecars(src_dir, tmp)

        reader = functools.partial(_calibration_reader, src, src_dir, prompts, cfg, opts)
        cfg, outliers = _outliers_kept_float(src, src_dir, cfg)
        info = quantize_model(src, tmp / MODEL_FILE, cfg, calibration=reader)
        if outliers is not None:  # the reason each kept MatMul stayed float, and the next ones
            info["outliers"] = dict(sorted(outliers.items(), key=lambda kv: -kv[1]["ratio"])[:6])
        checked, problems = check_structure(tmp / MODEL_FILE, cfg.keep_float)
        report: dict = {
            "scheme": cfg.scheme,
            "params": cfg.params() | info,
            "bytes": model_bytes(tmp / MODEL_FILE),
            "source_bytes": model_bytes(src),
            "structure": {
                "weights_checked": checked,
                "problems": problems,
                "quantized_weights": quantized_weights(tmp / MODEL_FILE),
            },
        }
        failures = [f"structure: {p}" for p in problems[:3]]
        if opts.gates is not None:
            results = gate_dirs(
                src_dir,
                tmp,
                opts.gates,
                opts.progress,
                allow_unverified=True,  # no manifest yet
                prompts=gating,
            )
            report["gates"] = gate_report(results, opts.gates)
            failures += [r.message for r in results if not r.passed]
        report["failures"] = failures
        _write_int8_manifest(tmp, src_dir, src, cfg, report)
        if failures and not opts.keep_failed:
            raise CheckFailed(report)
    return report


def _calibration_reader(src: Path, src_dir: Path, prompts: list, cfg: QuantConfig, opts: BuildOptions):
    """The static scheme's calibration data: ``prompts`` run through the float model, its KV cache included."""
    from tokenizers import Tokenizer

    from coinfer.quantize.calibrate import KvCalibrationReader

    bar = tqdm(total=len(prompts), desc="calibrate", unit="prompt", disable=not opts.progress)
    return KvCalibrationReader(
        src,
        Tokenizer.from_file(str(src_dir / "tokenizer.json")),
        prompts,
        cfg.calib_decode_steps,
        on_prompt=bar.update,
    )


def _outliers_kept_float(src: Path, src_dir: Path, cfg: QuantConfig) -> tuple[QuantConfig, dict | None]:
    """``cfg`` with ``keep_float``'s "auto" replaced by the MatMuls whose activations have outliers (measured on
    train-side prompts: the gates' stay held out), and those measurements; ``cfg`` as it is without "auto"."""
    if "auto" not in cfg.keep_float:
        return cfg, None
    from coinfer.quantize.outliers import activation_outliers, outlier_modules

    outliers = activation_outliers(src, default_prompts(src_dir, OUTLIER_PROMPTS, held_out=False, seed=2))
    keep = tuple(k for k in cfg.keep_float if k != "auto") + tuple(outlier_modules(outliers))
    return replace(cfg, keep_float=keep), outliers


def _write_int8_manifest(tmp: Path, src_dir: Path, src: Path, cfg: QuantConfig, report: dict) -> None:
    write_manifest(
        tmp,
        {
            "scheme": cfg.scheme,
            "params": report["params"],
            "opset": opset_of(tmp / MODEL_FILE),
            "source": {"path": str(src_dir), "sha256": sha256_file(src)},
            "tokenizer_sha256": tokenizer_hash(tmp),
            "providers": runs_on(cfg.scheme, src_dir),
            "checks": {
                "structure": report["structure"],
                "gates": report.get("gates"),
                "passed": not report["failures"],
            },
        },
    )
