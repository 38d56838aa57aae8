"""The Summary a session ends on: scores by draft, the trace, the answer's fields and finish."""

from __future__ import annotations

from coinfer import types as t
from coinfer.cloud.answer import Answer
from coinfer.cloud.ranking import Judged
from coinfer.cloud.summary import summary, trace
from coinfer.extract import Extraction
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN

RULES = RuleSet([], OPEN, {}, extraction=Extraction("marker"))


def _judged(i: int, valid: bool, text: str) -> Judged:
    v = t.Verdict(draft_index=i, valid=valid, score=0.9 if valid else 0.0, rules_passed=["arithmetic"])
    if not valid:
        v.failed_rule, v.error = "arithmetic", "3+5=9"
    return Judged(draft=t.Draft(index=i, text=text), verdict=v, parsed=RULES.parse(text))


def test_the_summary_reports_every_draft_the_answer_and_why():
    good, bad = _judged(1, True, "Answer: 17"), _judged(0, False, "Answer: 16")
    a = Answer(
        text="Answer: 17",
        source=t.AnswerSource.DRAFT,
        valid=True,
        parsed=good.parsed,
        chosen=[good],
        mode=t.RefineMode.ACCEPTED,
        finish=t.FinishReason.STOP,
        note="accepted",
    )
    req = t.OpenRequest(request_id="rid", task="", prompt="p")
    s = summary(
        req=req,
        judged={1: good, 0: bad},
        ranked=[(good, 1.2, 1.0)],
        answer=a,
        timings=t.Timings(total_ms=5.0),
        recommended_drafts=3,
        prompt_tokens=7,
        answer_tokens=2,
    )
    assert s.scores == [
        t.DraftScore(draft_index=0, valid=False, score=0.0, rank_score=0.0),
        t.DraftScore(draft_index=1, valid=True, score=0.9, rank_score=1.2),
    ]  # by index
    assert (s.answer, s.chosen_drafts, s.request_id, s.recommended_drafts) == ("Answer: 17", [1], "rid", 3)
    assert s.refine_mode == "accepted" and s.finish_reason == "stop" and s.fields["answer"] == 17
    assert (s.prompt_tokens, s.answer_tokens, s.timings.total_ms) == (7, 2, 5.0)
    assert s.trace == trace([good, bad], "accepted")
    assert s.trace == (
        "[THINKING_TRACE: Draft#1 scored 0.90, passed arithmetic; Draft#0 failed arithmetic: 3+5=9 | accepted]"
    )


def test_an_answer_that_failed_verification_reports_no_fields():
    a = Answer(
        text="x",
        source=t.AnswerSource.CLOUD,
        valid=False,
        parsed=RULES.parse("no marker"),
        mode=t.RefineMode.ALONE,
        finish=t.FinishReason.LENGTH,
        note="",
    )
    req = t.OpenRequest(request_id="rid", task="", prompt="p")
    s = summary(
        req=req,
        judged={},
        ranked=[],
        answer=a,
        timings=t.Timings(),
        recommended_drafts=3,
        prompt_tokens=1,
        answer_tokens=1,
    )
    assert s.fields == {} and s.chosen_drafts == [] and s.scores == [] and s.finish_reason == "length"
    assert s.trace == "[THINKING_TRACE:  | ]"
