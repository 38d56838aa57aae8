"""The decayed estimator: weights exp(-age / tau) on the caller's clock, spread and standard error kept,
nothing reset; the keyed table bounded where asked."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coinfer.estimator import Decayed, DecayedTable, beta_mean_sd, with_age

TAU = 10.0


def _fold(samples: list[tuple[float, float]], tau: float = TAU) -> Decayed:
    d = Decayed()
    for at, x in samples:
        d = d.add(x, at, tau)
    return d


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=2, max_size=50))
def test_samples_taken_at_once_give_the_plain_mean_and_sample_variance(xs):
    d = _fold([(0.0, x) for x in xs])
    assert d.mean == pytest.approx(statistics.fmean(xs), rel=1e-9, abs=1e-6)
    assert d.variance == pytest.approx(statistics.variance(xs), rel=1e-6, abs=1e-3)
    assert d.weight == len(xs) and d.n == pytest.approx(len(xs))
    assert d.stderr == pytest.approx(math.sqrt(statistics.variance(xs) / len(xs)), rel=1e-6, abs=1e-3)


def test_each_sample_weighs_exp_of_minus_its_age_over_tau():
    samples = [(0.0, 10.0), (3.0, 20.0), (7.5, 40.0), (20.0, 5.0)]
    now = 31.0
    d = _fold(samples).aged(now, TAU)
    w = [math.exp(-(now - at) / TAU) for at, _ in samples]
    mean = sum(wi * x for wi, (_, x) in zip(w, samples)) / sum(w)
    assert d.mean == pytest.approx(mean) and d.weight == pytest.approx(sum(w))
    assert d.sq_weight == pytest.approx(sum(wi * wi for wi in w))
    assert d.m2 == pytest.approx(sum(wi * (x - mean) ** 2 for wi, (_, x) in zip(w, samples)))


def test_an_estimate_left_alone_keeps_its_mean_and_spread_and_grows_uncertain():
    d = _fold([(float(i), 100.0 + (i % 3)) for i in range(30)])
    later = d.aged(d.at + 2 * TAU, TAU)
    assert later.mean == d.mean and later.variance == pytest.approx(d.variance) and later.n == pytest.approx(d.n)
    assert later.weight == pytest.approx(d.weight * math.exp(-2))
    assert later.stderr == pytest.approx(d.stderr * math.exp(1))  # sqrt(var / W), W down by e^-2
    assert d.aged(d.at - 5.0, TAU) == d  # a clock behind the estimate ages it by nothing


def test_one_sample_has_no_spread_and_a_fresh_sample_outweighs_a_faded_estimate():
    one = Decayed().add(7.0, 0.0, TAU)
    assert one.mean == 7.0 and one.variance is None and one.stderr is None
    assert Decayed().variance is None and Decayed().n == 0.0
    old = _fold([(float(i) / 10, 1600.0 + 50 * (i % 2)) for i in range(100)])  # measured under a burst
    new = old.add(100.0, old.at + 10 * TAU, TAU)  # long after: that burst weighs e^-10 of a fresh sample each
    assert new.mean == pytest.approx(100.0, abs=5.0)  # the burst: 63 samples, each e^-10 of a fresh one
    # the spread it now rests on is the gap between the two (n ~ 1): wide, not the old spread
    assert new.n < 1.01 and new.stderr > 500


def test_a_quality_from_200_samples_does_not_collapse_after_two_failures_11_s_apart():
    """Issue 51: ``STALE_AFTER_S`` reset the sample count of an outcome 10 s old: 0.92 from 200 samples fell
    to 0.46, then 0.23. Here the 200 samples keep the weight their age gives them."""
    samples = [(i / 10, 1.0 if i % 25 else 0.0) for i in range(200)]  # 10 a second for 20 s, 1 in 25 invalid
    before = _fold(samples)
    assert before.mean == pytest.approx(0.96, abs=0.01)
    one = before.add(0.0, 19.9 + 11.0, TAU)
    two = one.add(0.0, 19.9 + 22.0, TAU)
    assert one.mean > 0.9 and two.mean > 0.8  # 0.92 from 200 samples fell to 0.46, then 0.23
    w = [math.exp(-(41.9 - at) / TAU) for at, _ in samples] + [math.exp(-11.0 / TAU), 1.0]
    xs = [x for _, x in samples] + [0.0, 0.0]
    assert two.mean == pytest.approx(sum(a * b for a, b in zip(w, xs)) / sum(w))


def test_rates_read_as_a_beta_posterior_from_a_uniform_prior():
    assert Decayed().beta == (1.0, 1.0)
    d = _fold([(0.0, 1.0)] * 3 + [(0.0, 0.0)])
    assert d.beta == pytest.approx((4.0, 2.0))
    mean, sd = beta_mean_sd(*d.beta)
    assert mean == pytest.approx(4 / 6) and sd == pytest.approx(math.sqrt(8 / (36 * 7)))
    faded = d.aged(d.at + TAU * 50, TAU)
    assert faded.beta == pytest.approx((1.0, 1.0))  # no evidence left: every rate equally likely again


def test_a_table_decays_on_its_clock_and_restarts_on_a_reading():
    now = [0.0]
    table: DecayedTable[str] = DecayedTable(tau_s=TAU, clock=lambda: now[0])
    assert table.get("rtt") is None and table.age_s("rtt") == math.inf
    table.add("rtt", 10.0)
    table.add("rtt", 30.0)
    now[0] = TAU
    got = table.get("rtt")
    assert got.mean == 20.0 and got.weight == pytest.approx(2 * math.exp(-1)) and table.age_s("rtt") == TAU
    table.restart("rtt", 99.0)
    assert table.get("rtt").mean == 99.0 and table.get("rtt").weight == 1.0
    with pytest.raises(ValueError, match="tau_s"):
        DecayedTable(tau_s=0.0, clock=lambda: 0.0)


def test_a_bounded_table_keeps_the_keys_used_last():
    table: DecayedTable[int] = DecayedTable(tau_s=TAU, clock=lambda: 0.0, max_keys=100)
    for k in range(10_000):
        table.add(k, 1.0)
        if k >= 1:
            table.get(0)  # read: still in use
    assert len(table) == 100 and 0 in table and 9_999 in table and 5_000 not in table


def test_a_state_retimed_by_its_age_decays_as_if_it_had_never_left():
    d = _fold([(0.0, 5.0), (1.0, 7.0)])
    moved = with_age(d, 3.0, 1_000.0)  # saved 3 s after its newest sample, loaded at 1000 on another clock
    assert moved.aged(1_000.0, TAU).weight == pytest.approx(d.aged(d.at + 3.0, TAU).weight)
