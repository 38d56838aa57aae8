"""The auto-plan benchmark's arithmetic (its real run needs the servers: ``python -m benchmarks.auto_plan``)."""

from benchmarks import auto_plan


def _row(plan: str, ok: bool, ms: float, predicted: float = 0.0, ran: str = "", outcome: float = 0.0) -> dict:
    return {
        "kind": "arith",
        "plan": plan,
        "ran": ran or plan,
        "ok": ok,
        "ms": ms,
        "predicted_ms": predicted,
        "outcome_predicted_ms": outcome,
        "cloud_tokens": 10,
        "source": "refined",
        "plan_reason": "",
    }


def test_summary_and_goals_compare_auto_with_the_best_single_plan():
    rows = {
        "auto": [_row("auto", True, 100, 90, "edge -> split", 110), _row("auto", False, 50, 60, "edge", 40)],
        "edge": [_row("edge", False, 20), _row("edge", False, 20)],
        "split": [_row("split", True, 300), _row("split", True, 200)],
        "cloud": [_row("cloud", True, 150), _row("cloud", False, 150)],
    }
    report = {"all": {p: auto_plan.summarize(r) for p, r in rows.items()}}
    auto = report["all"]["auto"]
    assert auto["accuracy"] == 0.5 and auto["median_ms"] == 75.0 and auto["ran"] == {"edge -> split": 1, "edge": 1}
    assert auto["mean_measured_over_mean_predicted"] == 1.0  # (100 + 50) / (90 + 60)
    assert auto["outcome_ratio_median"] == round((100 / 110 + 50 / 40) / 2, 3)
    goals = auto_plan.goals(report)
    assert goals["best_single_plan"] == "split"  # the most accurate; latency breaks ties
    assert not goals["auto accuracy >= best - 2 pts"] and goals["auto median latency <= best's"]
    assert goals["auto measured / predicted within 1.3x"]


def test_first_content_is_tabled_against_vllms_first_token_and_open_prompts_have_no_accuracy():
    def streamed(plan: str, first: float, total: float) -> dict:
        return {**_row(plan, None, total), "kind": auto_plan.REAL, "ttft_ms": first}

    rows = [streamed("cloud", 30, 900), streamed("cloud", 50, 1100), streamed(auto_plan.VLLM, 20, 800)]
    by_plan = {p: auto_plan.summarize([r for r in rows if r["plan"] == p]) for p in ("cloud", auto_plan.VLLM)}
    assert by_plan["cloud"]["accuracy"] is None and by_plan["cloud"]["median_first_token_ms"] == 40.0
    table = auto_plan.first_content_table({"by_task": {auto_plan.REAL: by_plan}})
    assert "| real-open | cloud | 40 / 1000 | 2.00x | - |" in table.splitlines()
    assert "| real-open | vllm-greedy | 20 / 800 | 1.00x | - |" in table.splitlines()
