"""The cost model: monotonic where physics says so, cold start vs cloud, the quality floor."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coinfer.edge.planner.cost import (
    CloudProfile,
    EdgeProfile,
    Escalation,
    NetProfile,
    RequestShape,
    choose,
    cold_start_ms,
    pick,
    predict,
)
from coinfer.types import Plan

EDGE = EdgeProfile(
    model_bytes=200_000_000,
    disk_read_bps=500e6,
    pcie_h2d_bps=None,
    session_ms=400,
    warmup_ms=30,
    prefill_ms_per_token=0.2,
    step_ms={1: 5.0, 5: 7.0},
)
NET = NetProfile(rtt_ms=20, up_bps=10e6, down_bps=10e6)
CLOUD = CloudProfile(queue_ms=0, verify_ms=15, refine_ttft_ms=20, refine_ms_per_token=4, setup_ms=5)
REQ = RequestShape(
    prompt_tokens=40,
    draft_tokens=48,
    n_drafts=5,
    answer_tokens=40,
    prompt_bytes=40,
    draft_bytes=48,
    answer_bytes=40,
    split_steps=40,
    cloud_steps=56,
)
Q = {"edge": 0.4, "split": 0.7, "cloud": 0.6}
pos = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)


@given(rtt=pos, extra=pos)
def test_more_rtt_never_helps_a_plan_that_crosses_the_network(rtt, extra):
    for plan in ("split", "cloud"):
        a = predict(plan, REQ, EDGE, dataclasses.replace(NET, rtt_ms=rtt), CLOUD, 0.5).total_ms
        b = predict(plan, REQ, EDGE, dataclasses.replace(NET, rtt_ms=rtt + extra), CLOUD, 0.5).total_ms
        assert b >= a
    assert predict("edge", REQ, EDGE, dataclasses.replace(NET, rtt_ms=rtt), CLOUD, 0.5).transfer_ms == 0


@given(bw=st.floats(min_value=1e3, max_value=1e10), k=st.floats(min_value=1.0, max_value=100.0))
def test_more_bandwidth_never_hurts(bw, k):
    for plan in ("split", "cloud"):
        slow = predict(plan, REQ, EDGE, NetProfile(20, bw, bw), CLOUD, 0.5).total_ms
        fast = predict(plan, REQ, EDGE, NetProfile(20, bw * k, bw * k), CLOUD, 0.5).total_ms
        assert fast <= slow


@given(size=st.integers(min_value=1, max_value=10**10), k=st.integers(min_value=1, max_value=100))
def test_bigger_cold_model_costs_more_and_warm_costs_nothing(size, k):
    cold = dataclasses.replace(EDGE, state="cold", pcie_h2d_bps=8e9)
    a = cold_start_ms(dataclasses.replace(cold, model_bytes=size))
    b = cold_start_ms(dataclasses.replace(cold, model_bytes=size * k))
    assert b >= a > 0
    assert cold_start_ms(dataclasses.replace(cold, state="warm")) == 0
    assert cold_start_ms(dataclasses.replace(cold, state="loading", loading_remaining_ms=12)) == 12


@given(queue=pos, extra=pos)
def test_cloud_load_only_slows_cloud_plans(queue, extra):
    busy = dataclasses.replace(CLOUD, queue_ms=queue + extra)
    idle = dataclasses.replace(CLOUD, queue_ms=queue)
    for plan in ("split", "cloud"):
        assert predict(plan, REQ, EDGE, NET, busy, 0.5).total_ms >= predict(plan, REQ, EDGE, NET, idle, 0.5).total_ms
    assert predict("edge", REQ, EDGE, NET, busy, 0.5).total_ms == predict("edge", REQ, EDGE, NET, idle, 0.5).total_ms


def test_cold_edge_sends_the_request_to_the_cloud_warm_edge_splits():
    warm = choose(REQ, EDGE, NET, CLOUD, Q, quality_floor=0.65)
    assert warm.plan == "split"
    cold = choose(REQ, dataclasses.replace(EDGE, state="cold"), NET, CLOUD, Q, quality_floor=0.55)
    assert cold.plan == "cloud" and "fastest" in cold.reason
    assert cold.breakdowns["split"].cold_start_ms > 0 and cold.breakdowns["cloud"].cold_start_ms == 0


def test_quality_floor_and_no_cloud():
    anything = choose(REQ, EDGE, NET, CLOUD, Q, quality_floor=0.0)  # fastest when anything goes
    assert anything.plan == min(anything.breakdowns, key=lambda p: anything.breakdowns[p].total_ms)
    assert choose(REQ, EDGE, NET, CLOUD, Q, quality_floor=0.9).plan == "split"  # none qualifies: best quality
    only = choose(REQ, EDGE, None, None, Q, quality_floor=0.9)
    assert only.plan == "edge" and set(only.breakdowns) == {"edge"}
    with pytest.raises(ValueError, match="plan: unknown"):
        predict("moon", REQ, EDGE, NET, CLOUD, 0.5)


def test_step_time_interpolates_between_measured_batch_sizes():
    e = dataclasses.replace(EDGE, step_ms={1: 5.0, 5: 9.0})
    assert e.step(1) == 5.0 and e.step(3) == pytest.approx(7.0) and e.step(7) == pytest.approx(11.0)


@given(mspt=pos, extra=pos, steps=st.floats(min_value=0, max_value=1e4))
def test_a_slower_or_longer_cloud_generation_only_slows_cloud_plans(mspt, extra, steps):
    fast, slow = (dataclasses.replace(CLOUD, refine_ms_per_token=v) for v in (mspt, mspt + extra))
    short = dataclasses.replace(REQ, split_steps=steps, cloud_steps=steps)
    long = dataclasses.replace(REQ, split_steps=steps + extra, cloud_steps=steps + extra)
    for plan in ("split", "cloud"):
        assert (
            predict(plan, short, EDGE, NET, slow, 0.5).total_ms >= predict(plan, short, EDGE, NET, fast, 0.5).total_ms
        )
        assert predict(plan, long, EDGE, NET, fast, 0.5).total_ms >= predict(plan, short, EDGE, NET, fast, 0.5).total_ms
    assert predict("edge", long, EDGE, NET, slow, 0.5).total_ms == predict("edge", short, EDGE, NET, fast, 0.5).total_ms


def test_first_run_penalty_counts_only_before_the_model_is_warm():
    slow_first = dataclasses.replace(EDGE, first_run_ms=40.0)
    assert cold_start_ms(dataclasses.replace(slow_first, state="cold")) == pytest.approx(
        cold_start_ms(dataclasses.replace(EDGE, state="cold")) + 40.0
    )
    assert cold_start_ms(dataclasses.replace(slow_first, state="loading", loading_remaining_ms=5)) == 45.0
    assert cold_start_ms(slow_first) == 0.0


def test_noisy_step_times_never_make_bigger_batches_cheaper():
    e = dataclasses.replace(EDGE, step_ms={1: 5.0, 5: 9.0, 8: 7.0})
    assert e.step(20) == 7.0 and e.step(8) == 7.0


# ---- auto's edge plan and its escalation ---------------------------------------------------------
# an escalation's own history: its first round is known bad, so it retries once more on average
ESC = Escalation(shape=dataclasses.replace(REQ, rounds=2.0, split_steps=120), quality=0.8)


def test_an_edge_plan_whose_answers_usually_fail_is_predicted_with_the_escalations_cost():
    alone = predict("edge", REQ, EDGE, NET, CLOUD, 0.1)
    b = predict("edge", REQ, EDGE, NET, CLOUD, 0.1, ESC)
    # X = (R_x - 1) * E + R_x * RTT + (Bp + n * Bd)/up + Ba/down + queue + R_x * verify + ttft + S_x * ms/token
    e = 40 * 0.2 + 48 * 7.0  # prefill + 48 steps at batch 5
    up = (40 + 5 * 48) / 10e6 * 1e3
    x = e + 2 * 20 + up + 40 / 10e6 * 1e3 + 0 + 2 * 15 + 20 + 120 * 4
    assert b.escalation_p == pytest.approx(0.9) and b.escalation_cost_ms == pytest.approx(x)
    assert b.attempt_ms == pytest.approx(alone.total_ms)  # the edge's own run is unchanged
    assert b.total_ms == pytest.approx(alone.total_ms + 0.9 * x) and b.total_ms > 2 * alone.total_ms
    assert b.quality == pytest.approx(0.1 + 0.9 * 0.8)  # an edge answer is returned only when it passed
    assert b.as_dict()["escalation_ms"] == pytest.approx(0.9 * x)
    assert predict("edge", REQ, EDGE, None, None, 0.1, ESC) == alone  # no cloud: nothing to escalate to
    # an edge whose answers always pass never escalates: its prediction is the edge's own
    assert predict("edge", REQ, EDGE, NET, CLOUD, 1.0, ESC).total_ms == pytest.approx(alone.total_ms)


def test_the_issue_20_measurement_is_predicted_within_its_bounds():
    """98 of 120 edge answers escalated; median latency 652 ms against 83 ms predicted. With the
    escalation in the prediction the edge plan's expectation is the mix of both kinds of request."""
    edge = dataclasses.replace(EDGE, step_ms={5: (83 - 40 * 0.2) / 48})
    esc = Escalation(shape=dataclasses.replace(REQ, rounds=1.0, split_steps=140), quality=0.9)
    b = predict("edge", REQ, edge, NET, CLOUD, 22 / 120, esc)
    assert b.attempt_ms == pytest.approx(83)
    measured = (22 * 83 + 98 * (83 + b.escalation_cost_ms)) / 120  # what the 120 requests took on average
    assert b.total_ms == pytest.approx(measured)
    assert b.total_ms / b.attempt_ms > 5  # the old prediction (the attempt alone) was off by that much


def test_pick_takes_the_fastest_plan_meeting_the_floor_else_the_best_quality():
    q = {Plan.EDGE: 0.4, Plan.SPLIT: 0.7, Plan.CLOUD: 0.7}
    order = [Plan.EDGE, Plan.CLOUD, Plan.SPLIT]  # fastest first
    assert pick(order, q, 0.0) == (Plan.EDGE, True)
    assert pick(order, q, 0.5) == (Plan.CLOUD, True)
    assert pick(order, q, 0.9) == (Plan.CLOUD, False)  # none reaches it: the best quality, the faster of equals


def test_the_expected_cloud_cost_is_reported_not_weighed():
    """The cloud's reported engine tokens per answer ride in the breakdown for ``--explain``; the choice is the
    fastest plan (the thrift tie-break is gone: issue 51)."""
    req = dataclasses.replace(REQ, split_steps=10, cloud_steps=50, split_work=100.0, cloud_work=300.0)
    edge = dataclasses.replace(EDGE, step_ms={1: 5.0, 5: 4.0})
    c = choose(req, edge, NET, CLOUD, Q, quality_floor=0.5)
    assert c.plan == min((Plan.SPLIT, Plan.CLOUD), key=lambda p: c.breakdowns[p].total_ms)
    assert c.breakdowns[Plan.SPLIT].cloud_work == 100.0 and c.breakdowns[Plan.CLOUD].cloud_work == 300.0
    # the edge plan costs the cloud its escalations' share of a split: p * the split's reported work
    esc = Escalation(shape=dataclasses.replace(req, split_work=900.0), quality=0.9)
    assert predict("edge", req, edge, NET, CLOUD, 0.25, esc).cloud_work == pytest.approx(0.75 * 900.0)
    assert predict("edge", req, edge, None, None, 0.25).cloud_work == 0.0  # no cloud: no cost


def test_choose_weighs_the_edge_by_its_escalation():
    q = {"edge": 0.1, "split": 0.7, "cloud": 0.6}
    # a fast edge whose answers nearly always fail: auto's edge is an edge attempt plus a split nearly
    # every time, slower than splitting at once
    fast = dataclasses.replace(EDGE, step_ms={5: 2.0})
    c = choose(REQ, fast, NET, CLOUD, q, escalation=ESC)
    assert c.plan != "edge" and c.breakdowns["edge"].total_ms > c.breakdowns["split"].total_ms
    assert choose(REQ, fast, NET, CLOUD, q).plan == "edge"  # without the term it looked fastest
    # an edge whose answers usually pass: fastest, and its escalations lift it over the quality floor
    good = choose(REQ, fast, NET, CLOUD, q | {"edge": 0.9}, quality_floor=0.95, escalation=ESC)
    assert good.plan == "edge" and good.breakdowns["edge"].quality == pytest.approx(0.9 + 0.1 * 0.8)
    assert "fastest" in good.reason and good.breakdowns["edge"].total_ms < good.breakdowns["split"].total_ms
    assert "10% of answers escalated to split" in good.reason
    assert choose(REQ, EDGE, None, None, q, escalation=ESC).plan == "edge"


@given(p_q=st.floats(min_value=0.0, max_value=1.0), extra=pos)
def test_a_costlier_escalation_never_makes_the_edge_cheaper(p_q, extra):
    slow = Escalation(
        shape=dataclasses.replace(ESC.shape, split_steps=ESC.shape.split_steps + extra), quality=ESC.quality
    )
    a = predict("edge", REQ, EDGE, NET, CLOUD, p_q, ESC).total_ms
    b = predict("edge", REQ, EDGE, NET, CLOUD, p_q, slow).total_ms
    assert b >= a >= predict("edge", REQ, EDGE, NET, CLOUD, p_q).total_ms
