"""A draft that stands as is answers the session at once (``PolicyConfig.accept_first``), around a scripted
engine: the drafts after it are not scored and the rest of the round is not read; the LLM verifier scores
one draft at a time; an answer the drafts must agree on, a draft cut at its budget, and the policy turned
off all wait for the round's end.

Sessions run on virtual time (tests/virtual_time.py): the engine's scripted delays, the rounds and the deadline
race exactly as written, however busy the machine."""

from __future__ import annotations

import asyncio

from coinfer import types as t
from coinfer.cloud.config import CloudConfig, PolicyConfig
from coinfer.cloud.session import DraftsDone, Session
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN, get_task
from tests.cloud.engines import LIKELIHOOD, RIGHT, WRONG, ScriptedEngine, apples, draft
from tests.cloud.test_hedge import ARITH_BAD, ARITH_KW, ARITH_RIGHT, _collect
from tests.cloud.test_judging import SELECT_PROMPT, SELECT_RIGHT, SELECT_SLIPS
from tests.streams import shown
from tests.virtual_time import run

SKY = t.OpenRequest(request_id="r", task="", prompt="Explain why the sky is blue.")
PROSE = "Air scatters blue light more than red, so the sky looks blue."
OTHER = "Sunlight is scattered by the air; blue is scattered most."
LIKELY = [-0.1] * 8
"""The target's logprobs of a draft it would write as confidently as the draft model did (own -0.1)."""


class SlowScoring(ScriptedEngine):
    """Each scoring takes ``score_s``, and the most scorings at once is recorded (on virtual time two scorings
    begun side by side overlap whatever the machine's load: the rule checks between them take no time)."""

    def __init__(self, *a, score_s: float = 0.05, **kw) -> None:
        super().__init__(*a, **kw)
        self.score_s, self.now, self.most = score_s, 0, 0

    async def continuation_logprobs(self, prompt, continuation, request_id, end=True):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.score_s)
            return await super().continuation_logprobs(prompt, continuation, request_id, end)
        finally:
            self.now -= 1


def session(engine, req=SKY, task=OPEN, spec=None, **policy) -> Session:
    return Session(
        cfg=CloudConfig(policy=PolicyConfig(**{"hedge_below_odds": 0.0, **LIKELIHOOD, **policy})),
        engine=engine,
        req=req,
        task=task,
        spec=spec or {},
        rules=RuleSet(req.rules, task, spec or {}, extraction=req.extraction),
        recommended_drafts=5,
        deadline_s=10.0,
    )


async def _run(s: Session, drafts: list[t.Draft], close: bool) -> tuple[list, list[bool]]:
    """The session over ``drafts``; the round closes after them where ``close``, else never: a session that
    waits for it meets the 5 s guard, virtual (a session here takes at most a few 0.05 s scorings), so it fails at once."""
    read_after: list[bool] = []

    async def inbox():
        for d in drafts:
            yield d
        if not close:
            await asyncio.Event().wait()  # the edge still drafting
            read_after.append(True)  # pragma: no cover - a session that stood must not wait for this
        yield DraftsDone(len(drafts))

    return await asyncio.wait_for(_collect(s.run(inbox())), 5.0), read_after


def _verdicts(events) -> dict[int, t.Verdict]:
    return {v.draft_index: v for v in events if isinstance(v, t.Verdict)}


def test_free_text_the_target_finds_as_likely_answers_at_once_and_the_rest_is_not_scored():
    engine = SlowScoring({PROSE: LIKELY, OTHER: LIKELY}, reply="unused")
    s = session(engine)
    events, read_after = run(_run(s, [draft(0, PROSE), draft(1, OTHER), draft(2, OTHER + " Yes.")], False))
    summary = events[-1]
    assert isinstance(summary, t.Summary) and summary.answer == PROSE and summary.source == t.AnswerSource.DRAFT
    assert summary.refine_mode == t.RefineMode.ACCEPTED and not read_after
    assert engine.scored == 1 and engine.most == 1 and engine.generated == 0  # one prefill, no decode
    v = _verdicts(events)
    assert v[0].valid and set(v) == {0, 1, 2}  # every draft read has its verdict, before the Summary
    assert all(v[i].error.startswith("not_scored: a draft before it was accepted") for i in (1, 2))
    assert max(events.index(x) for x in v.values()) < len(events) - 1


def test_the_verifier_scores_one_draft_at_a_time_until_one_stands():
    unlikely = [-4.0] * 8  # valid by no threshold
    engine = SlowScoring({OTHER: unlikely, PROSE: LIKELY}, reply="unused")
    s = session(engine)
    events, _ = run(_run(s, [draft(0, OTHER), draft(1, PROSE), draft(2, OTHER + " Yes.")], False))
    assert events[-1].answer == PROSE
    assert engine.most == 1 and engine.scored == 2  # the first refused, the second stood, the third unscored
    v = _verdicts(events)
    assert not v[0].valid and "low_likelihood" in v[0].error and v[2].error.startswith("not_scored")


def test_where_the_rules_decide_a_draft_they_pass_answers_at_once():
    engine = ScriptedEngine({}, reply=ARITH_BAD)
    s = session(engine, **ARITH_KW)
    events, read_after = run(_run(s, [draft(0, ARITH_BAD), draft(1, ARITH_RIGHT)], False))
    assert events[-1].answer == ARITH_RIGHT and events[-1].source == t.AnswerSource.DRAFT and not read_after
    assert engine.scored == engine.generated == 0


def test_an_answer_the_drafts_must_agree_on_waits_for_the_round():
    engine = SlowScoring({RIGHT: LIKELY, WRONG: LIKELY}, reply="unused")
    s = session(engine, req=apples())  # an extracted answer: agreement counts
    events, _ = run(_run(s, [draft(0, RIGHT), draft(1, WRONG), draft(2, RIGHT)], True))
    assert engine.scored == 2  # both scored (the third is the first's duplicate: its support)
    assert engine.most == 2  # side by side: no draft of it could answer alone
    assert not any(v.error.startswith("not_scored") for v in _verdicts(events).values())


def test_a_draft_cut_at_its_budget_or_the_policy_off_waits_for_the_round():
    for d, policy in ((draft(0, PROSE, truncated=True), {}), (draft(0, PROSE), {"accept_first": False})):
        engine = SlowScoring({PROSE: LIKELY, OTHER: LIKELY}, reply=" more.")
        s = session(engine, **policy)
        events, _ = run(_run(s, [d, draft(1, OTHER)], True))
        assert engine.scored == 2, policy
        assert not any(v.error.startswith("not_scored") for v in _verdicts(events).values())
    assert engine.most == 2  # off: side by side, as before


def test_a_repaired_draft_where_the_rules_decide_answers_at_once_with_no_engine_work():
    select = get_task("select")
    req = t.OpenRequest(request_id="r", task="select", prompt=SELECT_PROMPT)
    engine = ScriptedEngine({}, reply="unused")
    s = session(engine, req=req, task=select, spec=select.parse_problem(SELECT_PROMPT))
    wrong_choice = SELECT_SLIPS.replace("answer A,D", "answer B,D")
    events, read_after = run(_run(s, [draft(0, wrong_choice), draft(1, SELECT_SLIPS)], False))
    summary = events[-1]
    assert summary.answer == SELECT_RIGHT and summary.refine_mode == t.RefineMode.REPAIRED and not read_after
    assert summary.source == t.AnswerSource.DRAFT and summary.answer_valid and summary.chosen_drafts == [1]
    assert engine.scored == engine.generated == 0
    v = _verdicts(events)
    assert not v[0].valid and v[1].valid and v[1].repaired.startswith("task_check:select_steps")
    assert "once repaired (as written: task_check:select_steps" in summary.trace
    assert shown(events) == SELECT_RIGHT  # streamed as final: what the answer is
