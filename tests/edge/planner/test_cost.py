"""The cost model: monotonic where physics says so, cold start vs cloud, the quality floor."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.planner.cost import CloudProfile, EdgeProfile, NetProfile, RequestShape, choose, cold_start_ms, predict

EDGE = EdgeProfile(model_bytes=200_000_000, disk_read_bps=500e6, pcie_h2d_bps=None, session_ms=400, warmup_ms=30,
                   prefill_ms_per_token=0.2, step_ms={1: 5.0, 5: 7.0})
NET = NetProfile(rtt_ms=20, up_bps=10e6, down_bps=10e6)
CLOUD = CloudProfile(queue_ms=0, verify_ms=15, refine_ttft_ms=20, refine_ms_per_token=4, setup_ms=5)
REQ = RequestShape(prompt_tokens=40, draft_tokens=48, n_drafts=5, answer_tokens=40, prompt_bytes=40, draft_bytes=48,
                   answer_bytes=40, split_steps=40, cloud_steps=56)
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
        assert predict(plan, short, EDGE, NET, slow, 0.5).total_ms >= predict(plan, short, EDGE, NET, fast, 0.5).total_ms
        assert predict(plan, long, EDGE, NET, fast, 0.5).total_ms >= predict(plan, short, EDGE, NET, fast, 0.5).total_ms
    assert predict("edge", long, EDGE, NET, slow, 0.5).total_ms == predict("edge", short, EDGE, NET, fast, 0.5).total_ms


def test_first_run_penalty_counts_only_before_the_model_is_warm():
    slow_first = dataclasses.replace(EDGE, first_run_ms=40.0)
    assert cold_start_ms(dataclasses.replace(slow_first, state="cold")) == pytest.approx(
        cold_start_ms(dataclasses.replace(EDGE, state="cold")) + 40.0)
    assert cold_start_ms(dataclasses.replace(slow_first, state="loading", loading_remaining_ms=5)) == 45.0
    assert cold_start_ms(slow_first) == 0.0


def test_noisy_step_times_never_make_bigger_batches_cheaper():
    e = dataclasses.replace(EDGE, step_ms={1: 5.0, 5: 9.0, 8: 7.0})
    assert e.step(20) == 7.0 and e.step(8) == 7.0
