"""The sampled check's arithmetic (``coinfer.cloud.sampled``): a token's probability at a temperature from the
top k of a prefill, within the bound it states; and the point-mass test, which leaves the written token
distributed as the target's own whatever the draft proposes."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from coinfer.cloud.sampled import MAX_ERROR, Row, take, token_prob


def _distribution(rng: np.random.Generator, vocab: int, spread: float) -> np.ndarray:
    """Raw log-probabilities of a vocabulary: Gumbel-ish logits, ``spread`` wide."""
    logits = rng.standard_normal(vocab) * spread
    return logits - np.logaddexp.reduce(logits)


def _row(lp: np.ndarray, x: int, k: int) -> Row:
    order = np.argsort(-lp)[:k]
    return Row(own=float(lp[x]), top=tuple(float(v) for v in lp[order]), own_in_top=bool(x in order))


def _true(lp: np.ndarray, x: int, temperature: float) -> float:
    scaled = lp / temperature
    return float(math.exp(scaled[x] - np.logaddexp.reduce(scaled)))


def test_temperature_one_is_the_prefills_own_probability_exactly():
    p, err = token_prob(Row(own=math.log(0.3), top=(math.log(0.5), math.log(0.3)), own_in_top=True), 1.0)
    assert p == pytest.approx(0.3) and err == 0.0


@pytest.mark.parametrize("temperature", [0.2, 0.5, 0.7, 1.3, 2.0])
def test_at_any_temperature_the_true_probability_lies_within_the_stated_error(temperature):
    rng = np.random.default_rng(7)
    widths = []
    for trial in range(200):
        lp = _distribution(rng, vocab=500, spread=float(rng.uniform(0.5, 6.0)))
        x = int(rng.integers(0, 500)) if trial % 3 == 0 else int(np.argmax(lp))  # in and out of the top k
        p, err = token_prob(_row(lp, x, k=20), temperature, vocab=500)
        true = _true(lp, x, temperature)
        assert p - err - 1e-12 <= true <= p + err + 1e-12, (trial, p, err, true)
        widths.append(err)
    assert min(widths) < 0.05  # the bound says something (the peaked distributions above are known closely)


def test_above_temperature_one_an_unknown_vocabulary_bounds_nothing():
    rng = np.random.default_rng(3)
    lp = _distribution(rng, vocab=300, spread=2.0)
    p, err = token_prob(_row(lp, int(np.argmax(lp)), k=20), 1.5, vocab=0)
    assert p - err == 0.0 and err > MAX_ERROR  # nothing known below: the take ends there, the target samples


def test_a_take_goes_on_while_the_coins_fall_under_p_and_names_the_token_refused():
    rows = [Row(own=math.log(p), top=(math.log(p),), own_in_top=True) for p in (0.9, 0.8, 0.5)]
    coins = iter([0.1, 0.7, 0.6]).__next__
    t = take([11, 12, 13], rows, 1.0, coins)
    assert (t.accepted, t.refused) == (2, 13)
    t = take([11, 12, 13], rows, 1.0, iter([0.0, 0.0, 0.0]).__next__)
    assert (t.accepted, t.refused) == (3, None)


def test_a_take_ends_without_refusing_where_the_probability_is_too_uncertain():
    uncertain = Row(own=math.log(0.2), top=(math.log(0.2),), own_in_top=True)  # 0.8 of the mass unknown
    t = take([5, 6], [Row(own=0.0, top=(0.0,), own_in_top=True), uncertain], 1.5, lambda: 0.0, vocab=1000)
    assert (t.accepted, t.refused) == (1, None)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_whatever_the_draft_the_written_token_is_distributed_as_the_targets(temperature):
    """The whole test: take, and where refused, the target's token sampled with the refused one excluded
    (the engine's logit bias); 40 000 draws for a fixed draft token and for the draft model's argmax."""
    lp = np.log(np.array([0.45, 0.25, 0.15, 0.1, 0.05]))
    target = np.exp(lp / temperature - np.logaddexp.reduce(lp / temperature))
    rng, draws = random.Random(11), 40_000
    for x in (0, 3):  # the target's argmax, and a token it finds unlikely
        row = _row(lp, x, k=5)
        counts = np.zeros(5)
        for _ in range(draws):
            t = take([x], [row], temperature, rng.random, vocab=5)
            if t.refused is None:
                counts[x] += 1
            else:
                rest = target.copy()
                rest[t.refused] = 0.0
                counts[rng.choices(range(5), weights=rest)[0]] += 1
        freq = counts / draws
        # 40 000 draws: a frequency's standard error is at most 0.0025; 0.012 is ~5 of them
        assert np.abs(freq - target).max() < 0.012, (x, freq, target)
