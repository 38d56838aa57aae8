"""The judge alone, around a stand-in engine: rules first, then the LLM verifier; duplicates as support;
where the rules decide no model is asked; an answer re-checked by the same rules and threshold."""

from __future__ import annotations

import asyncio

import pytest

from coinfer import types as t
from coinfer.cloud.judging import Judge
from coinfer.rules import RuleSet
from coinfer.tasks import get_task
from tests.cloud.engines import RIGHT, ScriptedEngine, apples, context, draft

SLIP = "Tom buys 3 * 4 = 13 apples.\nAnswer: 13"


def _judge(engine: ScriptedEngine, **policy) -> Judge:
    return Judge(context(engine, apples(), **policy))


def test_a_draft_the_rules_fail_costs_no_model_time():
    engine = ScriptedEngine({}, reply="")
    judge = _judge(engine, repair_drafts=False)
    v = asyncio.run(judge.verdict(draft(0, SLIP)))
    assert not v.valid and v.failed_rule == "arithmetic" and engine.scored == 0
    assert judge.judged[0].verdict is v and judge.ranked() == []
    # a slip no calculator can repair (a division by zero) fails as written, repairs on
    engine = ScriptedEngine({}, reply="")
    judge = _judge(engine)
    v = asyncio.run(judge.verdict(draft(0, "Tom buys 3 / 0 = 4 apples.\nAnswer: 4")))
    assert not v.valid and v.failed_rule == "arithmetic" and not v.repaired and engine.scored == 0


def test_an_open_draft_whose_computed_values_slip_is_judged_repaired_by_the_verifier():
    slips = RIGHT.replace("= 12 apples", "= 13 apples").replace("5 + 12 = 17", "5 + 13 = 19").replace(": 17", ": 19")
    engine = ScriptedEngine({RIGHT: [-0.2] * 12}, reply="")
    judge = _judge(engine, min_mean_logprob=-0.5, relative_margin=0.5)
    v = asyncio.run(judge.verdict(draft(0, slips)))
    assert v.valid and v.repaired.startswith("arithmetic: arithmetic_wrong: 3 * 4 = 13") and engine.scored == 1
    assert judge.judged[0].draft.text == RIGHT and judge.ranked()[0][0].draft.index == 0
    # the verifier still judges it, against the absolute threshold: the draft model's own logprob (-2.0,
    # which would relax it to -2.5) was of the text it wrote, not of the repaired one
    engine = ScriptedEngine({RIGHT: [-1.0] * 12}, reply="")
    v = asyncio.run(_judge(engine, min_mean_logprob=-0.5, relative_margin=0.5).verdict(draft(0, slips, own=-2.0)))
    assert not v.valid and v.failed_rule == "likelihood"


def test_the_likelihood_verifier_scores_and_thresholds_a_draft_and_records_its_logprobs():
    engine = ScriptedEngine({RIGHT: [-0.1] * 11 + [-2.0]}, reply="")
    judge = _judge(engine)
    v = asyncio.run(judge.verdict(draft(0, RIGHT, own=-0.1)))
    assert v.valid and v.rules_passed[-1] == "likelihood" and v.verify_ms > 0
    assert (
        judge.min_logprob(0) == -2.0
        and judge.mean_logprob(0) == pytest.approx(-3.1 / 12)
        and judge.mean_logprob(1) is None
    )
    assert engine.request_ids == [judge.ctx.request_id("v0")]
    engine.logprobs[RIGHT] = [-1.0] * 12  # the draft model was sure (-0.1), the target is not
    bad = asyncio.run(_judge(engine).verdict(draft(0, RIGHT, own=-0.1)))
    assert not bad.valid and bad.failed_rule == "likelihood" and bad.error.startswith("low_likelihood")


def test_a_duplicate_shares_the_verdict_being_computed_and_counts_as_support():
    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply="")
    judge = _judge(engine)

    async def both() -> list[t.Verdict]:
        return await asyncio.gather(judge.verdict(draft(0, RIGHT)), judge.verdict(draft(1, RIGHT + " ")))

    first, dup = asyncio.run(both())
    assert engine.scored == 1 and dup.duplicate_of == 1 and dup.valid == first.valid
    assert judge.judged[0].support == 2 and judge.judged[1].support == 0
    assert judge.mean_logprob(1) == judge.mean_logprob(0)
    assert [j.draft.index for j, _, _ in judge.ranked()] == [0]


def test_of_two_duplicates_the_first_to_arrive_is_verified_whichever_rule_check_ends_first():
    """Rule checks run side by side in threads; the dedup keys are claimed in arrival order, so a slow
    check of the first draft does not make the second the original (it did under load: a flaky test)."""
    import threading
    import time

    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply="")
    judge = _judge(engine)
    check, second_checked = judge.ctx.rules.check, threading.Event()

    def slow_first(text: str, parsed=None):
        if text == RIGHT:  # draft 0: its check ends only after draft 1's has
            second_checked.wait(5.0)
            time.sleep(0.05)
        out = check(text, parsed)
        if text != RIGHT:
            second_checked.set()
        return out

    judge.ctx.rules.check = slow_first

    async def both() -> list[t.Verdict]:
        return await asyncio.gather(judge.verdict(draft(0, RIGHT)), judge.verdict(draft(1, RIGHT + " ")))

    first, dup = asyncio.run(both())
    assert second_checked.is_set() and engine.scored == 1
    assert first.duplicate_of == 0 and dup.duplicate_of == 1  # draft 1 is draft 0's duplicate (1-based)
    assert judge.judged[0].support == 2


def test_where_the_rules_decide_a_passing_draft_is_valid_with_no_model_asked():
    from coinfer.tasks import TASKS

    arith = TASKS["arith"]
    prompt = "If x=3 and y=5, compute (x+y)^2-x*y."
    spec = arith.parse_problem(prompt)
    req = t.OpenRequest(request_id="r", task="arith", prompt=prompt)
    engine = ScriptedEngine({}, reply="")
    v = asyncio.run(Judge(context(engine, req, arith, spec)).verdict(draft(0, arith.solve(spec))))
    assert v.valid and v.score == 1.0 and engine.scored == 0


def test_the_judge_verifier_asks_the_model_for_a_verdict():
    engine = ScriptedEngine({}, reply="", judged='{"valid": false, "score": 0.2, "error": "step 2"}')
    v = asyncio.run(_judge(engine, verifier="judge").verdict(draft(0, RIGHT)))
    assert not v.valid and v.failed_rule == "judge" and v.error == "step 2" and engine.scored == 0
    engine.judged = '{"valid": true, "score": 0.9, "error": ""}'
    v = asyncio.run(_judge(engine, verifier="judge").verdict(draft(0, RIGHT)))
    assert v.valid and v.score == 0.9 and v.rules_passed[-1] == "judge"


def test_a_recheck_applies_the_rules_and_the_threshold_only_where_asked():
    engine = ScriptedEngine({RIGHT: [-1.0] * 12}, reply="")
    judge = _judge(engine)
    ok, why, parsed = asyncio.run(judge.recheck(SLIP, likelihood=False))
    assert not ok and why.startswith("arithmetic:") and parsed.fields["answer"] == 13
    assert asyncio.run(judge.recheck(RIGHT, likelihood=False))[:2] == (True, "") and engine.scored == 0
    ok, why, _ = asyncio.run(judge.recheck(RIGHT, than=-0.1))  # the draft it replaces scored -0.1
    assert not ok and why.startswith("low_likelihood") and engine.scored == 1
    assert asyncio.run(judge.recheck(RIGHT, than=-0.9))[0]  # relative to a draft the target found -0.9
    assert judge.mean_logprob(-1) is None  # a re-checked answer is not a draft: nothing recorded


SELECT_PROMPT = "Pick 2 of A(4,9) B(3,6) C(8,2) D(1,8) with cost<=8."
SELECT_RIGHT = "AB 7:15; AC 12>8; AD 5:17; BC 11>8; BD 4:14; CD 9>8; answer A,D"
SELECT_SLIPS = "AB 7:16; AC 9:11; AD 5:16; BC 11>8; BD 5>8; CD 9>8; answer A,D"
"""The right subsets and choice, with sums a calculator corrects."""


def _select_judge(engine: ScriptedEngine, *, own_rules: bool = False, **policy) -> Judge:
    """A judge of the select problem; ``own_rules``: the preset's checks named as the request's own rules (the
    same checks, but a client's: they do not decide alone)."""
    task = get_task("select")
    req = t.OpenRequest(request_id="r", task="select", prompt=SELECT_PROMPT)
    spec = task.parse_problem(SELECT_PROMPT)
    rules = RuleSet(task.default_rules(spec), task, spec) if own_rules else None
    return Judge(context(engine, req, task, spec, rules, **policy))


def test_where_the_rules_decide_a_draft_whose_sums_are_wrong_is_judged_repaired():
    engine = ScriptedEngine({}, reply="")
    judge = _select_judge(engine)
    v = asyncio.run(judge.verdict(draft(0, SELECT_SLIPS)))
    assert v.valid and v.repaired.startswith("task_check:select_steps: step_wrong: AB value 16 (expected 15)")
    assert judge.judged[0].draft.text == SELECT_RIGHT and engine.scored == 0  # the answer takes the repaired text
    # a repaired draft that chose wrong still fails, with the draft's own first error
    bad = asyncio.run(judge.verdict(draft(1, SELECT_SLIPS.replace("answer A,D", "answer B,D"))))
    assert not bad.valid and not bad.repaired and bad.error.startswith("step_wrong: AB value 16")
    assert judge.judged[1].draft.text == SELECT_SLIPS.replace("answer A,D", "answer B,D")
    # a draft right as written is judged as written
    assert asyncio.run(judge.verdict(draft(2, SELECT_RIGHT))).repaired == ""


def test_no_repair_with_the_policy_off_or_where_the_rules_do_not_decide():
    for policy in ({"repair_drafts": False}, {"own_rules": True}):
        judge = _select_judge(ScriptedEngine({SELECT_SLIPS: [-0.1] * 12}, reply=""), **policy)
        v = asyncio.run(judge.verdict(draft(0, SELECT_SLIPS)))
        assert not v.valid and not v.repaired and judge.judged[0].draft.text == SELECT_SLIPS
