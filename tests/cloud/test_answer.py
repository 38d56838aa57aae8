"""The pure text work around the cloud's answers: step prefixes, finish reasons, copied prompt text."""

from __future__ import annotations

from coinfer import types as t
from coinfer.chat import CANDIDATE_FORMAT, REFINE_TEMPLATE
from coinfer.cloud.answer import draft_answer, finish_reason, join_steps, scaffolding_error, strip_candidate_label
from coinfer.cloud.ranking import Judged


def test_steps_join_into_a_prefix_with_no_trailing_space():
    assert join_steps([]) == ""
    assert join_steps(["AB 7:15", "AC 12>8"]) == "AB 7:15; AC 12>8;"


def test_the_finish_reason_follows_the_engine_and_keeps_the_current_one_while_it_runs():
    assert finish_reason("length") is t.FinishReason.LENGTH
    assert finish_reason("stop") is t.FinishReason.STOP
    assert finish_reason("abort") is t.FinishReason.STOP  # anything else ended by itself
    assert finish_reason(None, t.FinishReason.LENGTH) is t.FinishReason.LENGTH
    assert finish_reason(None) is t.FinishReason.STOP
    assert t.FinishReason.REPETITION == "repetition"  # the wire string (coinfer.repetition's)


def test_a_refinement_that_copies_the_template_is_caught_and_a_copied_label_dropped():
    line = next(x.strip() for x in REFINE_TEMPLATE.split("\n") if len(x.strip()) >= 12 and "{" not in x)
    assert scaffolding_error("Answer: 17", REFINE_TEMPLATE) == ""
    assert scaffolding_error(f"{line}\nAnswer: 17", REFINE_TEMPLATE).startswith("scaffolding: the refinement copies")
    label = CANDIDATE_FORMAT.split("{text}", 1)[0].format(n=2)
    assert strip_candidate_label(f"  {label}Answer: 17", CANDIDATE_FORMAT, 2) == "Answer: 17"
    assert strip_candidate_label(f"{label}Answer: 17", CANDIDATE_FORMAT, 1) == f"{label}Answer: 17"  # only (1) used
    assert strip_candidate_label("Answer: 17", CANDIDATE_FORMAT, 2) == "Answer: 17"


def test_a_draft_answer_is_the_draft_as_it_stands_with_its_own_finish():
    d = t.Draft(index=3, text="Answer: 17", num_tokens=12, mean_logprob=-0.1, edge_ms=1.0, truncated=True)
    best = Judged(draft=d, verdict=t.Verdict(draft_index=3, valid=True, score=0.9))
    a = draft_answer(best, t.RefineMode.DEADLINE, "why")
    assert (a.text, a.source, a.valid, a.chosen, a.mode, a.note) == (
        "Answer: 17",
        t.AnswerSource.DRAFT,
        True,
        [best],
        t.RefineMode.DEADLINE,
        "why",
    )
    assert a.finish is t.FinishReason.LENGTH and (a.steps, a.generated, a.ttft_ms) == (0, 0, 0.0)
