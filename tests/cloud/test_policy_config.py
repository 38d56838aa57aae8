"""PolicyConfig's bounds, declared on each field: a bad value fails when the config is built (at load),
naming the field; the verifier is its enum."""

from __future__ import annotations

import dataclasses
import math

import pytest

from coinfer import types as t
from coinfer.cloud.config import PolicyConfig
from coinfer.cloud.server import build_parser, load_config
from coinfer.serving.bounds import Bound


def test_a_bad_policy_value_fails_at_load_naming_the_field():
    ap = build_parser()
    args = ap.parse_args(["--engine.model", "/m", "--policy.max-retries", "-1"])
    with pytest.raises(ValueError, match=r"^policy\.max_retries: must be in \[0, inf\), got -1$"):
        load_config(ap, args, env={})
    cfg = load_config(ap, ap.parse_args(["--engine.model", "/m", "--policy.verifier", "judge"]), env={})
    assert cfg.policy.verifier is t.VerifierKind.JUDGE


@pytest.mark.parametrize(
    "field, value, msg",
    [
        ("a", -0.1, r"must be in \[0, "),
        ("min_support", 0, r"must be in \[1, "),
        ("context_drafts", 0, r"must be in \[1, "),
        ("accept_min_token_logprob", 1.0, r"must be in .*, 0\], got"),
        ("min_round_odds", 1.5, r"must be in .*, 1\], got"),
        ("refine_temperature", 2.5, r"must be in .*, 2\], got"),
        ("relative_margin", -1.0, r"must be in \[0, "),
        ("accept_free_text_margin", 11.0, r"must be in .*, 10\], got"),
        ("refine_max_tokens", 0, r"must be in \[1, "),
        ("calculator_fixes", 9, r"must be in .*, 8\], got"),
        ("cloud_candidates", -1, r"must be in \[0, "),
        ("default_deadline_ms", 0, r"must be in \[1, "),
        ("learn_every", -1, r"must be in \[0, "),
        ("learn_alpha", 0.0, r"must be in \(0, "),
        ("learn_alpha", 1.5, r"must be in .*, 1\], got"),
        ("verifier", "oracle", "must be likelihood|judge"),
    ],
)
def test_each_bounded_field_refuses_a_value_outside_its_range(field, value, msg):
    with pytest.raises(ValueError, match=rf"^policy\.{field}: {msg}"):
        PolicyConfig(**{field: value})


def test_the_defaults_and_the_documented_off_values_are_accepted():
    PolicyConfig()
    off = PolicyConfig(relative_margin=None, accept_free_text_margin=None, min_round_odds=0.0, learn_every=0)
    assert off.relative_margin is None and off.learn_every == 0
    PolicyConfig(accept_min_score=2.0, min_mean_logprob=-math.inf, min_mean_logprob_floor=-math.inf)  # > 1, -inf: off
    assert PolicyConfig(verifier="likelihood").verifier is t.VerifierKind.LIKELIHOOD


def test_a_value_changed_after_construction_is_checked_by_validate():
    p = PolicyConfig()
    p.cloud_candidates = -2
    with pytest.raises(ValueError, match=r"^policy\.cloud_candidates: must be in \[0, inf\), got -2$"):
        p.validate()
    with pytest.raises(ValueError, match="min_mean_logprob_floor"):
        PolicyConfig(min_mean_logprob=-1.0, min_mean_logprob_floor=-0.5)


def test_every_numeric_policy_field_declares_its_bounds():
    numeric = [f for f in dataclasses.fields(PolicyConfig) if f.type in ("int", "float", "float | None")]
    assert numeric and all(isinstance(f.metadata.get("bound"), Bound) for f in numeric)
    assert Bound(ge=0).error(float("nan")) == "must be in [0, inf), got nan"
