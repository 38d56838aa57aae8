"""benchmarks.gpu_check: it refuses an onnxruntime build without the accelerator asked for, and its
whole path (demo draft variants, placement, the edge engine's batched drafting) runs as a CPU rehearsal."""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest

from benchmarks import gpu_check


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this build has CUDA")
def test_a_build_without_cuda_is_refused_with_its_environment_recorded(tmp_path):
    assert gpu_check.main(["--out", str(tmp_path)]) == 3
    env = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]["environment"]["result"]
    assert "CUDAExecutionProvider" not in env["providers"]
    assert env["onnxruntime"] == ort.__version__


def test_a_step_that_fails_keeps_the_others_and_one_past_the_budget_is_skipped(tmp_path):
    rep = gpu_check.Report(tmp_path, budget_s=60)
    rep.step("ok", lambda: {"x": 1})
    rep.step("bad", lambda: 1 / 0)
    rep.step("late", lambda: {"x": 2}, needs_s=3600)
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["ok"]["result"] == {"x": 1}
    assert steps["bad"]["error"].startswith("ZeroDivisionError")
    assert "skipped" in steps["late"]


@pytest.mark.slow
def test_the_cpu_rehearsal_places_every_variant_and_drafts_in_batches(tmp_path):
    rc = gpu_check.main(
        [
            "--out",
            str(tmp_path),
            "--skip-large",
            "--providers",
            "CPUExecutionProvider",
            "--steps",
            "placement",
            "drafting",
            "buffer",
        ]
    )
    assert rc == 0
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    placements = {k: v["result"] for k, v in steps.items() if "/placement/" in k}
    made = steps["demo-draft/buffer/prepare"]["result"]
    assert len(made["dirs"]) == 3 and made["errors"] == {}  # FP32, INT8 weight-only and FP16
    assert len(placements) == 5 + len(made["dirs"])  # FP32, FP16, the three INT8 schemes; the buffer graphs
    for p in placements.values():
        assert p["session"] == ["CPUExecutionProvider"] and not p["problems"]
    drafting = {k: v["result"] for k, v in steps.items() if "/drafting/" in k}
    assert len(drafting) == 4 + len(made["dirs"]) - 1  # the buffer graphs but FP32
    for d in drafting.values():
        assert d["ms_1"] > 0 and d["ms_5"] > 0 and d["tokens_1"] > 0 and d["tokens_5"] > 0
