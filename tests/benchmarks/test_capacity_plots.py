"""benchmarks.capacity_plots: a PNG per workload from run reports, and the work bars' arithmetic."""

from __future__ import annotations

import json

from benchmarks import capacity_plots


def _entry(p95s: list[float], work: dict) -> dict:
    steps = [{"rate": 2.0 * (i + 1), "p95_s": p} for i, p in enumerate(p95s)]
    return {"capacity_rps": 2.0, "steps": steps, "work_per_answer": work}


def test_the_bars_split_computed_prefill_into_scored_and_the_rest_past_the_prefix_cache():
    w = {"prompt_tokens": 100, "cached_tokens": 60, "scored_tokens": 30, "decoded_tokens": 7}
    assert capacity_plots.work_parts(w) == (30, 10, 7)
    assert capacity_plots.work_parts({"prompt_tokens": 100, "decoded_tokens": 7}) == (0, 100, 7)  # no cache hits told
    assert capacity_plots.work_parts({"engine_requests": 1}) is None


def test_one_png_per_workload_from_every_runs_report(tmp_path):
    run = {
        "slo_s": {"arith": 0.5, "words": 1.0},
        "workloads": {
            "arith": {"split": _entry([0.1, 0.3, 0.9], {"prompt_tokens": 80, "decoded_tokens": 5})},
            "words": {"vllm-greedy": _entry([0.2, 2.0], {})},
        },
    }
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text("progress\n" + json.dumps(run) + "\n", encoding="utf-8")
    assert capacity_plots.main([*map(str, paths), "--out", str(tmp_path / "plots")]) == 0
    for wl in ("arith", "words"):
        png = (tmp_path / "plots" / f"{wl}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
