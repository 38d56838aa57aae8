"""The policy's thresholds as pure decisions: the likelihood floor, a draft taken as is, a draft cut short."""

from __future__ import annotations

import math

from coinfer import types as t
from coinfer.cloud.acceptance import cut_short, free_text_not_as_is, likelihood_floor, not_as_is, reported
from coinfer.cloud.config import PolicyConfig
from coinfer.cloud.ranking import Judged


def _judged(score: float = 0.95, own: float = -0.1, truncated: bool = False, num_tokens: int = 12) -> Judged:
    d = t.Draft(index=0, text="text", num_tokens=num_tokens, mean_logprob=own, edge_ms=1.0, truncated=truncated)
    return Judged(draft=d, verdict=t.Verdict(draft_index=0, valid=True, score=score))


def test_the_likelihood_floor_is_relative_to_the_draft_models_own_confidence_within_bounds():
    p = PolicyConfig()  # absolute -0.5, margin 0.5, floor -3
    assert likelihood_floor(p, None) == -0.5 and likelihood_floor(p, 0.0) == -0.5  # not reported: absolute
    assert likelihood_floor(p, -0.9) == -1.4  # the draft model's own -0.9, less the margin
    assert likelihood_floor(p, -0.05) == -0.55  # never stricter than ...: relaxed to own - margin only
    assert likelihood_floor(p, -50.0) == -3.0  # a claimed own value cannot go below the floor
    assert likelihood_floor(PolicyConfig(relative_margin=None), -0.9) == -0.5  # margin off: absolute
    assert not reported(0.0) and not reported(None) and reported(-0.01)
    off = PolicyConfig(min_mean_logprob=-math.inf, min_mean_logprob_floor=-math.inf)
    assert likelihood_floor(off, None) == -math.inf  # -inf disables the threshold


def test_a_draft_is_taken_as_is_only_when_likely_agreed_on_and_without_a_doubted_token():
    p = PolicyConfig()
    best = _judged()
    assert not_as_is(p, best, 1.0, free_text=False, min_lp=-1.0, mean_lp=-0.1) == ""
    assert not_as_is(p, _judged(score=0.5), 1.0, free_text=False, min_lp=-1.0, mean_lp=-0.1).startswith("score 0.50")
    assert not_as_is(p, best, 0.4, free_text=False, min_lp=-1.0, mean_lp=-0.1).startswith("agreement 0.40")
    assert not_as_is(p, best, 1.0, free_text=False, min_lp=-4.0, mean_lp=-0.1).startswith("a token at logprob -4.00")
    # no logprobs measured: the likelihood verifier has none to vouch for the draft, the judge's score stands
    assert not_as_is(p, best, 1.0, free_text=False, min_lp=None, mean_lp=None).startswith("a token at logprob -inf")
    judge = PolicyConfig(verifier=t.VerifierKind.JUDGE)
    assert not_as_is(judge, best, 1.0, free_text=False, min_lp=None, mean_lp=None) == ""


def test_free_text_stands_when_the_target_is_about_as_confident_as_the_draft_model():
    p = PolicyConfig()  # margin 0.25, token bound -8
    assert free_text_not_as_is(p, -0.63, -0.64, -2.7) == ""
    assert free_text_not_as_is(p, -0.63, -1.0, -2.7).startswith("free text: target mean logprob -1.00 < own -0.63")
    assert free_text_not_as_is(p, -0.63, -0.64, -18.8).startswith("free text: a token at logprob -18.80")
    assert free_text_not_as_is(p, 0.0, -0.64, -2.7) == "free text: no relative likelihood to judge it by"
    assert free_text_not_as_is(p, -0.63, None, -2.7) == "free text: no relative likelihood to judge it by"
    off = PolicyConfig(accept_free_text_margin=None)
    assert free_text_not_as_is(off, -0.63, -0.64, -2.7) == "free text: no relative likelihood to judge it by"
    # not_as_is hands free text to it, whatever the score
    assert not_as_is(p, _judged(score=0.1, own=-0.63), 0.0, free_text=True, min_lp=-2.7, mean_lp=-0.64) == ""


def test_a_draft_is_cut_short_when_truncated_below_the_answer_budget():
    assert cut_short(_judged(truncated=True, num_tokens=256), 512)
    assert not cut_short(_judged(truncated=True, num_tokens=512), 512)  # the answer's own budget: complete
    assert not cut_short(_judged(truncated=False, num_tokens=12), 512)
