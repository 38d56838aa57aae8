"""A session's rounds of drafts: the limits on what it takes, and the advice after a round with no valid draft."""

from __future__ import annotations

import dataclasses

import pytest

from coinfer import types as t
from coinfer.cloud.config import Limits
from coinfer.cloud.policy import RoundOdds
from coinfer.cloud.rounds import MAX_PENALTY, MAX_TEMPERATURE, Rounds, request_kind, retry_advice
from coinfer.errors import InvalidArgument, ResourceExhausted
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import OPEN


def test_drafts_are_taken_once_each_within_the_limits():
    r = Rounds(limits=Limits(max_drafts=2, max_draft_chars=10))
    r.take(t.Draft(index=0, text="a"))
    with pytest.raises(InvalidArgument, match="draft.index: 0 was already sent"):
        r.take(t.Draft(index=0, text="b"))
    with pytest.raises(ResourceExhausted, match="draft.text: 11 chars > limit 10"):
        r.take(t.Draft(index=1, text="x" * 11))
    r.take(t.Draft(index=1, text="b"))
    assert r.drafts_left == 0
    with pytest.raises(ResourceExhausted, match="more than 2 drafts"):
        r.take(t.Draft(index=2, text="c"))


def test_a_round_closes_on_the_count_the_edge_sent():
    r = Rounds(limits=Limits())
    r.take(t.Draft(index=0, text="a"))
    with pytest.raises(InvalidArgument, match="done.count: 2 but 1 drafts"):
        r.close(2)
    r.close(1)
    assert r.in_round == 0 and r.seen == {0}
    r.close(0)  # an empty round is a round


def test_retry_advice_explores_more_each_round_and_says_why():
    failed = [
        t.Verdict(draft_index=0, valid=False, error="arithmetic: 3+5=9"),
        t.Verdict(draft_index=1, valid=False, error="arithmetic: 2*2=5"),
        t.Verdict(draft_index=2, valid=False, error="format: no answer"),
        t.Verdict(draft_index=3, valid=True),
    ]
    one = retry_advice(verdicts=failed, attempt=1, drafts_left=16, recommended=3)
    two = retry_advice(verdicts=failed, attempt=2, drafts_left=16, recommended=3)
    assert one.reason == "arithmetic x2, format x1" and one.attempt == 1
    assert (one.num_drafts, two.num_drafts) == (5, 7)
    assert two.sampling.temperature > one.sampling.temperature > t.SamplingParams().temperature
    assert two.sampling.presence_penalty > one.sampling.presence_penalty
    assert retry_advice(verdicts=failed, attempt=2, drafts_left=4, recommended=3).num_drafts == 4  # the budget
    late = retry_advice(verdicts=[], attempt=50, drafts_left=16, recommended=3)
    assert late.reason == "no drafts" and late.sampling.temperature == MAX_TEMPERATURE
    assert late.sampling.presence_penalty == late.sampling.frequency_penalty == MAX_PENALTY
    late.sampling.validate("sampling")  # capped within what a request may ask


def test_rounds_are_counted_by_draft_model_task_and_the_kinds_of_the_rules():
    req = t.OpenRequest(request_id="r", task="", prompt="p", rules=[Rule("arithmetic")], draft_model="sha256:a")
    kind = request_kind(req, RuleSet(req.rules, OPEN, {}))
    assert kind == ("sha256:a", "", ("arithmetic",))
    assert kind != request_kind(req, RuleSet([], OPEN, {}))
    other = dataclasses.replace(req, draft_model="sha256:b")
    assert request_kind(other, RuleSet(req.rules, OPEN, {})) != kind


def test_the_names_a_client_gives_its_rules_make_no_kind_of_their_own():
    """Issue 51: rounds were counted by the rules' labels, a client's names among them: a kind per request,
    a table that never shrinks. 10,000 differently named rules of one kind are one kind."""
    odds = RoundOdds(clock=lambda: 0.0)
    for i in range(10_000):
        req = t.OpenRequest(request_id="r", task="", prompt="p", rules=[Rule("length", {"max": 900}, name=f"r{i}")])
        odds.observe(request_kind(req, RuleSet(req.rules, OPEN, {})), False)
    assert len(odds) == 1


def test_one_draft_models_misses_leave_anothers_rounds_waited_for():
    """Issue 51: the odds were shared across edges and draft models: one edge's weak draft model made the
    cloud hedge, leaving another edge's valid drafts unscored."""
    odds = RoundOdds(clock=lambda: 0.0)
    weak, good = ("sha256:weak", "words", ("arithmetic",)), ("sha256:good", "words", ("arithmetic",))
    for _ in range(40):
        odds.observe(weak, False)
    assert odds.rare(weak, 0.25) and not odds.rare(good, 0.25) and odds.pays(good, 0.3)
