"""Several capacity runs as one table (``benchmarks.capacity_runs``): medians and ranges per system, and ratios
taken within each run before they are summarised."""

from __future__ import annotations

import json

from benchmarks.capacity_runs import load, main, summarise


def _run(split: float, cloud: float, auto: float, greedy: float | None = 10.0, lower: bool = False) -> dict:
    systems = {
        "split": {"capacity_rps": split, "accuracy": 1.0, "capacity_lower_bound": lower},
        "cloud": {"capacity_rps": cloud, "accuracy": 0.9},
        "auto": {"capacity_rps": auto, "accuracy": 1.0},
    }
    if greedy is not None:
        systems["vllm-greedy"] = {"capacity_rps": greedy, "accuracy": 0.8}
    return {"workloads": {"arith": systems}}


def test_ratios_are_taken_within_each_run_then_summarised():
    runs = [_run(100, 20, 50), _run(40, 80, 80), _run(60, 30, 66, greedy=None, lower=True)]
    s = summarise(runs)["arith"]
    assert {k: v for k, v in s["systems"]["split"].items() if v} == {
        "runs": 3,
        "median": 60,
        "min": 40,
        "max": 100,
        "lower_bound": True,
        "accuracy": {"runs": 3, "median": 1.0, "min": 1.0, "max": 1.0},
    }  # (no work, edge-only share or CPU at the common rate in these runs)
    # auto over the better plan of each run: 50/100, 80/80, 66/60, not a median over medians (66 / 60)
    assert s["ratios"]["auto / best of split, cloud"] == {"runs": 3, "median": 1.0, "min": 0.5, "max": 1.1}
    assert s["ratios"]["split / vllm-greedy"]["runs"] == 2  # the third run has no vLLM greedy


def test_reads_each_reports_last_line_and_prints_a_table(tmp_path, capsys):
    paths = []
    for i, run in enumerate([_run(100, 20, 50), _run(40, 80, 80)]):
        p = tmp_path / f"run{i}.out"
        p.write_text("progress line\n" + json.dumps(run) + "\n\n", encoding="utf-8")
        paths.append(p)
    assert len(load(paths)) == 2
    assert main([str(p) for p in paths]) == 0
    out = capsys.readouterr().out
    assert "| arith | split | 70 [40, 100] (n=2) |" in out and "auto / best of split, cloud" in out


def test_answers_the_edge_gave_alone_are_no_cloud_capacity_and_split_is_weighed_against_the_best_baseline():
    run = _run(100, 20, 50)
    systems = run["workloads"]["arith"]
    systems["auto"] |= {"cloud_capacity_rps": 25.0, "edge_only_share": 0.5}
    for name, cap in (("vllm-repair", 30.0), ("vllm-resample", 40.0), ("vllm-ngram", 12.0), ("vllm-best-of-5", 3.0)):
        systems[name] = {"capacity_rps": cap, "accuracy": 1.0, "work_per_answer": {"engine_requests": 1, "steps": 9}}
    s = summarise([run])["arith"]
    assert s["systems"]["auto"]["median"] == 25.0 and s["systems"]["auto"]["edge_only_share"]["median"] == 0.5
    assert s["ratios"]["split / best baseline"]["median"] == 2.5  # 100 / vllm-resample's 40
    assert s["ratios"]["auto / best of split, cloud"]["median"] == 0.25
    # and read as the whole system's rate within the SLO, the edge's answers included: 50 / 100
    assert s["ratios"]["auto / best of split, cloud, every answer at the SLO"]["median"] == 0.5
    assert s["systems"]["vllm-repair"]["work_per_answer"] == {"engine_requests": 1, "steps": 9}


def test_the_a_a_ratio_reads_two_systems_that_send_the_server_the_same_requests():
    run = _run(100, 20, 50)
    run["workloads"]["arith"]["vllm-repair"] = {"capacity_rps": 15.0, "accuracy": 0.9}
    s = summarise([run])["arith"]
    assert s["ratios"]["A/A: vllm-repair / vllm-greedy"]["median"] == 1.5  # greedy's 10: noise, not a difference
