"""A session's context: the request's sampling over the policy's, the answer budget, the rules' say."""

from __future__ import annotations

import pytest

from coinfer import types as t
from coinfer.rules import RuleSet
from coinfer.tasks import TASKS
from tests.cloud.engines import ScriptedEngine, context


def test_the_requests_sampling_overrides_the_policys_and_is_clamped_to_its_budget():
    engine = ScriptedEngine({}, reply="")
    ctx = context(engine, refine_temperature=0.3)
    assert ctx.params(100).max_tokens == 100 and ctx.params(100).temperature == 0.3
    assert ctx.answer_budget == ctx.policy.refine_max_tokens
    req = t.OpenRequest(request_id="r", task="", prompt="p", refine=t.SamplingParams(max_new_tokens=12, seed=7))
    ctx = context(engine, req)
    p = ctx.params(100)
    assert (p.max_tokens, p.temperature, p.seed) == (12, req.refine.temperature, 7)
    assert ctx.answer_budget == 12


def test_the_rules_decide_only_where_they_are_exact():
    engine = ScriptedEngine({}, reply="")
    arith = TASKS["arith"]
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2-x*y.")
    req = t.OpenRequest(request_id="r", task="arith", prompt="If x=3 and y=5, compute (x+y)^2-x*y.")
    assert context(engine, req, arith, spec).rules_decide
    # the same checks named as the request's own rules: a client's rules, which do not decide alone
    assert not context(engine, req, arith, spec, RuleSet(arith.default_rules(spec), arith, spec)).rules_decide
    assert not context(engine).rules_decide  # an open request's rules are not exact
    assert context(engine).thresholded and not context(engine, req, arith, spec).thresholded


def test_request_ids_are_unique_per_session_and_the_context_is_read_only():
    engine = ScriptedEngine({}, reply="")
    a, b = context(engine), context(engine)
    assert a.request_id("v0") != b.request_id("v0") and a.request_id("v0").endswith("-v0")
    with pytest.raises(AttributeError):
        a.rules = b.rules
    assert a.prompt_text == engine.render(a.req.conversation)
