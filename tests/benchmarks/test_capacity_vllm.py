"""benchmarks.capacity_vllm: the plain-vLLM baselines' work counts and the checkers a user of plain vLLM could run on
its answers (the servers themselves: tests/benchmarks/test_capacity.py's tiny run)."""

from __future__ import annotations

import asyncio
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
    assert cv.work(_usage(40, 12, None))["cached_tokens"] == 0  # no details (an older vLLM): no hit
    assert cv.tokens(_usage(40, 12, 32)) == 20  # as coinfer's work_tokens: the prompt past the cache, the decode
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


class Client:
    """An OpenAI client stand-in that streams scripted answers (the baseline's logic only; the real server:
    tests/benchmarks/test_capacity.py's tiny run)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.asked = list(answers), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **kw):
        self.asked.append(kw)
        text = self.answers.pop(0)

        async def stream():
            yield SimpleNamespace(choices=[SimpleNamespace(delta=SimpleNamespace(content=text))], usage=None)
            yield SimpleNamespace(choices=[], usage=_usage(20, 5, 0))

        return stream()


def test_the_resampling_baseline_samples_again_while_the_checkers_refuse_and_takes_the_first_they_pass():
    case = cases(("select",), 1, 4)[0]
    right = get_task("select").solve(get_task("select").parse_problem(case.prompt))
    client = Client(["nonsense", "still nonsense", right])
    r = asyncio.run(cv.ask_checked(client, "m", Request([{"role": "user", "content": case.prompt}], case, 64), 2))
    assert r.ok is True and r.source == "resample2"
    assert [a["temperature"] for a in client.asked] == [0.0, 0.7, 0.7] and [a["seed"] for a in client.asked] == [
        None,
        1,
        2,
    ]
    assert r.work == {
        "engine_requests": 3,
        "prompt_tokens": 60,
        "cached_tokens": 0,
        "scored_tokens": 0,
        "decoded_tokens": 15,
        "steps": 18,
    }
    client = Client(["nonsense", "still nonsense", "more nonsense"])
    r = asyncio.run(cv.ask_checked(client, "m", Request([], case, 64), 2))
    assert r.ok is False and r.source == "greedy:refused"  # none passed: the greedy answer stands
    client = Client(["nonsense"])
    r = asyncio.run(cv.ask_checked(client, "m", Request([], case, 64), 0))
    assert r.source == "greedy:refused" and len(client.asked) == 1  # vllm-repair: no resampling
