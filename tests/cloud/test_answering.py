"""The answerer alone, around a stand-in engine and a judge: which path answers (as is, continued,
refined, alone), and what it streams (final, or held and withdrawn when the refinement is refused)."""

from __future__ import annotations

import asyncio
import dataclasses

from coinfer import types as t
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.answering import Answerer
from coinfer.cloud.judging import Judge
from coinfer.rules import RuleSet
from coinfer.tasks import TASKS
from tests.cloud.engines import RIGHT, WRONG, Replies, ScriptedEngine, apples, apples_by_pattern, context, draft
from tests.streams import shown

RIGHT2 = RIGHT.replace("Tom", "Tom then")


def _answer(ctx, drafts: list[t.Draft], attempt: int = 0):
    """(answer, events streamed, answerer) once ``drafts`` are judged."""
    stream = AnswerStream()
    judge = Judge(ctx)
    answerer = Answerer(ctx, judge=judge, stream=stream)

    async def go():
        for d in drafts:
            await judge.verdict(d)
        a = await answerer.answer(judge.ranked(), attempt)
        stream.end()
        return a, [ev async for ev in stream.events()]

    a, events = asyncio.run(go())
    return a, events, answerer


def test_a_likely_agreed_draft_is_the_answer_as_is_streamed_final_at_once():
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply="unused")
    a, events, _ = _answer(context(engine, apples()), [draft(0, RIGHT), draft(1, RIGHT + " ")])
    assert a.mode is t.RefineMode.ACCEPTED and a.source == t.AnswerSource.DRAFT and a.text == RIGHT
    assert events == [t.AnswerChunk(RIGHT, True)] and engine.generated == 0
    assert a.note.startswith("best draft accepted as is")


def test_a_good_draft_cut_short_is_continued_and_a_failed_continuation_dropped():
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply=" That is all.")
    drafts = [draft(0, RIGHT, truncated=True), draft(1, RIGHT + " ", truncated=True)]
    a, events, _ = _answer(context(engine, apples()), drafts)
    assert a.text == RIGHT + " That is all." == shown(events) and a.mode is t.RefineMode.PREFIX
    assert events[0] == t.AnswerChunk(RIGHT, True) and not any(e.final for e in events[1:])
    engine = ScriptedEngine({RIGHT: [-0.05] * 12}, reply=" and 2 + 2 = 5")
    a, events, _ = _answer(context(engine, apples()), drafts)
    assert a.text == RIGHT == shown(events) and a.finish is t.FinishReason.LENGTH
    assert "continuation failed" in a.note


def test_the_clouds_own_answer_that_fails_gives_way_to_the_best_valid_draft():
    # issue 51, defect 2: under the arithmetic rule a doubted but valid draft was traded for the cloud's own
    # answer even where no step of it passed (its unchecked last try streamed as final): worse than the draft
    bad = "Answer: 5 * 3 = 16"  # every try fails, and none has a step that could stream before its end
    engine = Replies([bad] * 20)
    engine.logprobs = {RIGHT: [-0.1] * 12}  # valid, but never as is (accept_min_score 2)
    ctx = context(engine, apples(), accept_min_score=2.0, calculator_fixes=0, cloud_candidates=2)
    a, events, _ = _answer(ctx, [draft(0, RIGHT)])
    assert a.valid and a.text == RIGHT == shown(events) and a.source == t.AnswerSource.DRAFT
    assert "the cloud's own answer failed: best draft returned" in a.note
    assert not any(isinstance(e, t.AnswerReset) for e in events)  # nothing of the failed answer was shown


def test_a_refinement_that_contradicts_agreeing_drafts_is_withdrawn_for_the_best_draft():
    engine = ScriptedEngine({RIGHT: [-0.1] * 12, RIGHT2: [-0.09] * 12, WRONG: [-0.3] * 12}, reply=WRONG)
    ctx = context(engine, apples_by_pattern(), accept_min_score=2.0)  # never as is: refine
    a, events, _ = _answer(ctx, [draft(0, RIGHT), draft(1, RIGHT2)], attempt=2)
    assert a.text == RIGHT2 == shown(events) and a.source == t.AnswerSource.DRAFT
    assert a.mode is t.RefineMode.CANDIDATES and len(a.chosen) == 2 and "contradicts" in a.note
    resets = [e for e in events if isinstance(e, t.AnswerReset)]
    assert len(resets) == 1 and resets[0].reason.startswith("refinement rejected: contradicts")
    assert ctx.request_id("r2") in engine.request_ids and ctx.request_id("o2") in engine.request_ids  # attempt 2


def test_a_refinement_that_passes_is_the_answer():
    engine = ScriptedEngine({RIGHT: [-0.1] * 12}, reply="(1) " + RIGHT)  # a copied label is dropped
    a, events, _ = _answer(context(engine, apples_by_pattern(), accept_min_score=2.0), [draft(0, RIGHT)])
    assert a.source == t.AnswerSource.REFINED and a.text == RIGHT and a.valid
    assert not any(isinstance(e, t.AnswerReset) for e in events) and a.steps == a.generated == engine.generated


def test_the_refine_plan_continues_consensus_steps_only_of_a_likely_best_draft():
    arith, prompt = TASKS["arith"], "If x=3 and y=5, compute (x+y)^2-x*y."
    spec = arith.parse_problem(prompt)
    best, other = "3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49", "3+5=8; 8^2=64; 5*3=15; 64-15=49; answer 49"
    req = t.OpenRequest(request_id="r", task="arith", prompt=prompt)
    engine = ScriptedEngine({best: [-0.05] * 12, other: [-0.1] * 12}, reply=" 3*5=15; 64-15=49; answer 49")
    # the preset's checks as the request's own rules: they do not decide alone (a draft passing the preset's own
    # checkers would be the answer as is)
    steps = RuleSet(arith.default_rules(spec), arith, spec)
    ctx = context(engine, req, arith, spec, steps, accept_min_score=2.0)
    a, events, answerer = _answer(ctx, [draft(0, best), draft(1, other)])
    assert a.mode is t.RefineMode.PREFIX and events[0] == t.AnswerChunk("3+5=8; 8^2=64;", True)
    assert all(e.final for e in events) and a.text == best
    # a best draft the target doubts is not forced on it: candidates instead
    engine.logprobs = {best: [-0.5] * 12, other: [-0.6] * 12}
    ctx = context(engine, req, arith, spec, steps, accept_min_score=2.0)
    judge = Judge(ctx)
    for i, text in enumerate((best, other)):
        asyncio.run(judge.verdict(draft(i, text)))
    plan = Answerer(ctx, judge=judge, stream=AnswerStream()).refine_plan(judge.ranked())
    assert plan.mode is t.RefineMode.CANDIDATES and plan.prefix == "" and best in plan.prompt


def test_under_the_arithmetic_rule_a_doubted_draft_gives_the_clouds_own_checked_answer_not_candidates():
    # the target doubts the best draft (score 0.68, a token at -4): no refinement from candidates, whose prompt
    # holds the drafts; the cloud's own answer, checked as it streams
    engine = ScriptedEngine({WRONG: [-0.05] * 11 + [-4.0]}, reply=RIGHT)
    ctx = context(engine, apples())
    a, events, _ = _answer(ctx, [draft(0, WRONG)])
    assert a.source == t.AnswerSource.CLOUD and a.mode is t.RefineMode.ALONE and a.valid and a.text == RIGHT
    assert a.note.startswith("best draft not as is (score 0.68 < 0.90): cloud answered alone from 0 verified steps")
    assert all(e.final for e in events if isinstance(e, t.AnswerChunk)) and shown(events) == RIGHT
    assert not any("Candidate" in p for p in engine.prompts)  # no refinement prompt was built
    # not without the arithmetic rule (nothing checks the cloud's own answer), nor where its answer cannot stream
    # checked step by step (an answer read by a pattern: only the whole answer is checked)
    assert not context(engine, dataclasses.replace(apples(), rules=[])).own_over_candidates
    assert not context(engine, apples_by_pattern()).own_over_candidates


def test_no_valid_draft_hands_the_answer_to_the_cloud_alone():
    engine = ScriptedEngine({}, reply=RIGHT)
    a, _, _ = _answer(context(engine, apples(), max_retries=0), [draft(0, WRONG)])
    assert a.source == t.AnswerSource.CLOUD and a.mode is t.RefineMode.ALONE and a.valid


def test_why_not_as_is_reads_the_judges_logprobs_and_the_rules_can_decide():
    engine = ScriptedEngine({WRONG: [-0.05] * 11 + [-4.0]}, reply="unused")
    # score 0.68 passes: one token the target doubts
    ctx = context(engine, apples_by_pattern(), accept_min_score=0.6)
    a, _, answerer = _answer(ctx, [draft(0, WRONG)])
    assert a.mode is t.RefineMode.CANDIDATES and "a token at logprob -4.00" in a.note
    arith, prompt = TASKS["arith"], "If x=3 and y=5, compute (x+y)^2-x*y."
    spec = arith.parse_problem(prompt)
    req = t.OpenRequest(request_id="r", task="arith", prompt=prompt)
    ctx = context(ScriptedEngine({}, reply="unused"), req, arith, spec)
    a, _, answerer = _answer(ctx, [draft(0, arith.solve(spec), truncated=True)])
    assert a.mode is t.RefineMode.ACCEPTED  # the preset's checkers passed it: whole, not continued
    assert not answerer.cut_short(answerer.judge.ranked()[0][0])


BAD = RIGHT.replace("5 + 12 = 17", "5 + 12 = 15").replace("Answer: 17", "Answer: 15")
"""A refinement the arithmetic rule fails."""


def _refused(replies: list[str], **policy):
    """The answer to one doubted draft (WRONG) whose candidates refinement is the first of ``replies``."""
    engine = Replies(replies)
    engine.logprobs = {WRONG: [-0.1] * 12}
    ctx = context(engine, apples_by_pattern(), accept_min_score=2.0, **policy)
    a, events, _ = _answer(ctx, [draft(0, WRONG)])
    return a, events, engine


def test_a_candidates_refinement_that_fails_the_rules_gives_the_clouds_own_answer_where_it_passes():
    a, events, engine = _refused([BAD, RIGHT])
    assert a.source == t.AnswerSource.CLOUD and a.valid and a.text == RIGHT == shown(events)
    assert "refinement rejected (arithmetic" in a.note and "the cloud answered itself" in a.note
    assert a.generated == engine.generated  # the refused refinement's tokens counted with its own
    assert not any(e.final for e in events if isinstance(e, t.AnswerChunk) and BAD.startswith(e.text))


def test_where_the_clouds_own_answer_fails_too_the_best_draft_is_the_answer():
    a, events, engine = _refused(["I do not know."] * 20)
    assert a.source == t.AnswerSource.DRAFT and a.text == WRONG == shown(events)
    assert "the cloud's own answer failed too" in a.note and a.generated == engine.generated
