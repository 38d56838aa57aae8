import math

import pytest

from coinfer.cloud.load import DraftCountController
from coinfer.cloud.policy import consensus_prefix, likelihood_score, rank_scores, refine_max_tokens
from coinfer.tasks.base import split_steps


def test_likelihood_score_is_geometric_mean_probability():
    assert likelihood_score([]) == 0.0
    assert likelihood_score([math.log(0.5)] * 4) == pytest.approx(0.5)
    assert likelihood_score([0.0, math.log(0.25)]) == pytest.approx(0.5)


def test_rank_prefers_score_and_penalises_latency():
    r = rank_scores([0.9, 0.5], [0.0, 0.0], a=1.0, b=0.3, g=0.02)
    assert r[0] > r[1]
    slow, fast = rank_scores([0.8, 0.8], [10.0, 0.0], a=1.0, b=0.3, g=0.02)
    assert fast - slow == pytest.approx(0.2)
    # the agreement term: drafts that disagree lower everyone's rank
    agree = rank_scores([0.8, 0.8], [0, 0], 1.0, 0.3, 0.0)[0]
    disagree = rank_scores([0.8, 0.2], [0, 0], 1.0, 0.3, 0.0)[0]
    assert agree > disagree


def test_segments_and_consensus():
    a = split_steps("3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49")
    assert a == ["3+5=8", "8^2=64", "3*5=15", "64-15=49"]
    b = split_steps("3+5=8; 8^2=64; 3*5=16; answer 48")
    c = split_steps("3+5=9; answer 1")
    assert consensus_prefix([a, b, c], 2) == ["3+5=8", "8^2=64"]
    assert consensus_prefix([a, b, c], 3) == []
    assert consensus_prefix([a], 1) == a


def test_refine_budget_follows_the_seed_points():
    assert refine_max_tokens(0.95, cap=4096) == 512
    assert refine_max_tokens(0.72, cap=4096) == 256
    assert refine_max_tokens(0.99, cap=300) == 300
    assert refine_max_tokens(0.0, cap=4096) == 64


def test_draft_count_controller_policy_and_hysteresis():
    c = DraftCountController(alpha=1.0)
    assert c.update(0.1) == 3
    assert c.update(0.7) == 5
    assert c.update(0.9) == 3
    assert c.update(0.84) == 3  # inside the hysteresis band: stays heavy
    assert c.update(0.5) == 3 and c.level == 0
    smooth = DraftCountController(alpha=0.3)
    # one spike does not flip a smoothed controller
    assert [smooth.update(u) for u in (0.1, 0.1, 1.0, 0.1)] == [3, 3, 3, 3]


def test_answer_agreement_is_the_support_share_of_each_drafts_answer():
    from coinfer.cloud.policy import answer_agreement, rank_scores

    agree = answer_agreement([72.0, 72.0, 70.0, None], [1, 2, 1, 1])
    assert agree == [0.6, 0.6, 0.2, 0.2]  # support-weighted; no answer agrees only with itself
    ranks = rank_scores([0.5, 0.5, 0.6, 0.6], [0.0] * 4, a=1.0, b=0.3, g=0.0, agree=agree)
    assert ranks[0] > ranks[2]  # the majority answer outranks a slightly likelier lone one
    assert rank_scores([0.5, 0.7], [0.0, 0.0], 1.0, 0.3, 0.0) == rank_scores(
        [0.5, 0.7], [0.0, 0.0], 1.0, 0.3, 0.0, agree=[0.9, 0.9]
    )


def test_round_odds_stop_retries_where_rounds_never_hold_a_valid_draft_and_explore_as_they_fade():
    from coinfer.cloud.policy import ODDS_TAU_S, RoundOdds

    now = [0.0]
    odds = RoundOdds(clock=lambda: now[0])
    with pytest.raises(TypeError):
        RoundOdds(600.0, 2.0)  # keyword-only: numbers in a row are easy to swap
    assert odds.pays("select", 0.3) and odds.odds("select") == 0.5  # unseen: Laplace's 1 in 2, rounds pay
    for _ in range(3):
        odds.observe("select", False)
    assert odds.pays("select", 0.3)  # three misses may be bad luck: the bound is still above the floor
    for _ in range(37):
        odds.observe("select", False)
        odds.observe("arith", True)
    assert odds.upper("select") < 0.1 < 0.3 < odds.odds("arith")
    assert not odds.pays("select", 0.3) and odds.pays("arith", 0.3) and odds.pays("select", 0.0)  # 0: always
    # refused, the kind is no longer counted: its evidence fades until its rounds are worth a try again
    now[0] += ODDS_TAU_S
    assert not odds.pays("select", 0.3)
    now[0] += 2 * ODDS_TAU_S
    assert odds.pays("select", 0.3) and odds.odds("select") < 0.3  # still poor, but too uncertain to refuse


def test_retry_rounds_are_counted_apart_from_first_rounds():
    from coinfer.cloud.policy import RoundOdds, retry

    odds = RoundOdds(clock=lambda: 0.0)
    for _ in range(40):  # first rounds of words mostly hold a valid draft; the retries of the rest never do
        odds.observe("words", True)
        odds.observe(retry("words"), False)
    assert odds.odds("words") > 0.9 and odds.odds(retry("words")) < 0.1
    assert not odds.pays("words", 0.1)  # another round after a failed one is not worth its wait
    assert not odds.rare("words", 0.25)  # while the first round is still waited for (no hedge at open)
    assert odds.pays("arith", 0.1)  # another kind: unseen, the prior retries


def test_the_odds_table_stays_bounded_however_many_kinds_arrive():
    """Issue 51: ``RoundOdds`` grew by one entry per client-chosen rule name, forever."""
    from coinfer.cloud.policy import RoundOdds

    odds = RoundOdds(clock=lambda: 0.0, max_kinds=256)
    odds.observe("arith", False)
    for i in range(10_000):
        odds.observe((f"edge-{i}", "", ()), False)
        odds.odds("arith")  # in use: kept
    assert len(odds) == 256 and odds.odds("arith") == pytest.approx(1 / 3)


def test_an_idle_replicas_smoothed_load_reaches_zero_not_a_denormal():
    """The EWMA decays geometrically: an idle replica's Status said ``load`` 1.4e-45 (the float32 nearest)
    and the edge's /healthz printed it."""
    from coinfer.cloud.load import DraftCountController

    c = DraftCountController()
    c.update(1.0)
    for _ in range(200):
        c.update(0.0)
    assert c.smoothed == 0.0 and c.recommended == c.light
