"""benchmarks.capacity_vllm: the plain-vLLM baselines' work counts and the checkers a user of plain vLLM could run on
its answers (the servers themselves: tests/benchmarks/test_capacity.py's tiny run)."""

from __future__ import annotations

import re
from types import SimpleNamespace

from benchmarks import capacity_vllm as cv
from benchmarks.capacity_ladder import Request
from benchmarks.open_accuracy import cases
from coinfer.tasks import get_task


def _usage(prompt: int, completion: int, cached: int | None):
    details = None if cached is None else SimpleNamespace(cached_tokens=cached)
    return SimpleNamespace(prompt_tokens=prompt, completion_tokens=completion, prompt_tokens_details=details)


def test_vllm_usage_is_counted_as_coinfers_cost_is_with_steps_only_where_known():
    assert cv.work(_usage(40, 12, 32)) == {
        "engine_requests": 1,
        "prompt_tokens": 40,
        "cached_tokens": 32,
        "scored_tokens": 0,
        "decoded_tokens": 12,
        "steps": 13,  # a prefill, one step a token
    }
    assert "cached_tokens" not in cv.work(_usage(40, 12, None))  # the server did not report its hits
    assert "steps" not in cv.work(_usage(40, 12, 0), steps_known=False)  # n samples, or a speculating server
    assert cv.work(None) is None


def test_the_checked_baseline_repairs_a_wrong_computed_value_as_coinfers_cloud_would():
    case = next(
        c
        for c in cases(("arith",), 40, 3)
        if "; " in get_task("arith").solve(get_task("arith").parse_problem(c.prompt))
    )
    right = get_task("arith").solve(get_task("arith").parse_problem(case.prompt))
    first = re.search(r"=(-?\d+);", right)
    wrong = right[: first.start(1)] + str(int(first.group(1)) + 1) + right[first.end(1) :]
    req = Request([], case, 64)
    assert not cv._ruleset(case.kind, case.prompt).check(wrong)[0].valid  # refused as written
    ok, judged = cv.checked(req, wrong)
    assert ok and judged != wrong and case.grade(judged)  # the calculator rewrote the value in place
    assert cv.checked(req, right) == (True, right)
    words = Request([], cases(("words",), 1, 3)[0], 64)
    assert cv.checked(words, "no answer here")[0] is False  # the request's rules: a marker and a number
