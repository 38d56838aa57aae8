"""The planner: defaults said; the one exploration rule (a plan with no spread yet runs first; then the plan
fastest in a draw from the estimates, so that a plan left alone is tried again as its estimate grows
uncertain); what each run teaches the estimates."""

from __future__ import annotations

import dataclasses
import random

import pytest

from coinfer import types as t
from coinfer.edge.planner.estimates import DEFAULTS, TAU_S, Estimates
from coinfer.edge.planner.planner import EdgeState, Planner, PromptSize
from coinfer.edge.result import EdgeResult
from coinfer.types import ModelState, Plan

WARM = EdgeState(model_bytes=2_000_000, state=ModelState.WARM)
COLD = EdgeState(model_bytes=2_000_000, state=ModelState.COLD)
SIZE = PromptSize(40, 40)


def _planner(now: list[float] | None = None, **kw) -> Planner:
    clock = (lambda: now[0]) if now is not None else (lambda: 0.0)
    return Planner(Estimates(clock=clock), rng=random.Random(0), **kw)


def _choose(p: Planner, task: str = "arith", edge: EdgeState = WARM, cloud: bool = True):
    return p.choose(task=task, size=SIZE, n=5, edge=edge, cloud_available=cloud)


def _latencies(p: Planner, plan: str, task: str, values: list[float]) -> None:
    for v in values:
        p.est.observe(f"latency_ms.{plan}.{task}", v)


def test_the_planner_falls_back_to_defaults_says_so_and_is_called_by_keyword():
    p = _planner()
    c = _choose(p)
    assert c.plan in tuple(Plan) and set(c.breakdowns) == set(Plan) and isinstance(c.plan, Plan)
    assert any("not measured yet" in n for n in c.notes)
    assert _choose(p, edge=COLD, cloud=False).plan is Plan.EDGE
    with pytest.raises(TypeError):
        p.choose("arith", SIZE, 5, WARM, True)  # six arguments in a row are easy to swap
    with pytest.raises(TypeError):
        EdgeState(2_000_000, ModelState.WARM)  # type: ignore[misc]


def test_a_plan_with_no_spread_yet_runs_first_the_likeliest_fast_first_then_the_draws_decide():
    p = _planner()
    p.est.observe("quality.edge.arith", 1.0)
    ran = []
    for _ in range(6):
        c = _choose(p)
        assert c.reason.startswith(f"explore: {c.plan}'s latency for 'arith' has no spread yet")
        ran.append(c.plan)
        _latencies(p, c.plan, "arith", [c.breakdowns[c.plan].total_ms * 1.1])
    # each plan twice (a spread needs two runs), the plans predicted faster before the slower
    assert sorted(ran) == sorted([*Plan, *Plan]) and ran[0] == ran[1]
    predicted = _choose(p).breakdowns
    assert [predicted[x].total_ms for x in dict.fromkeys(ran)] == sorted(predicted[x].total_ms for x in Plan)
    c = _choose(p)
    assert c.reason.startswith(f"{c.plan}: fastest in this draw") and "+-" in c.reason and "runs' weight" in c.reason
    # a plan under the quality floor is not taken while another reaches it; without a cloud only the edge runs
    for plan in Plan:
        for _ in range(20):
            p.est.observe(f"quality.{plan}.arith", 1.0 if plan is Plan.CLOUD else 0.0)
    floor = Planner(p.est, quality_floor=0.9, rng=random.Random(1))
    assert all(_choose(floor).plan is Plan.CLOUD for _ in range(20))
    assert _choose(p, cloud=False).plan is Plan.EDGE


def _burst_then_quiet(now: list[float]) -> Planner:
    """Select: split measured in a burst at ~5 s a request (the cloud overloaded), the cloud plan fast."""
    p = _planner(now)
    e = p.est
    for key, value in {
        "step_ms.5": 1.0,  # drafting 48 ms
        "prefill_ms_per_token": 0.0,
        "rounds.select": 1.0,
        "rtt_ms": 10.0,
        "refine_ttft_ms": 300.0,
        "refine_ms_per_token": 1.0,  # the cloud plan ~490 ms
        "decode_steps.split.select": 0.0,  # drafts taken as they are
        "rounds.escalated.select": 20.0,  # the edge's escalations retry and retry: the edge plan ~2 s
        "verify_ms": 5_000.0,  # ... and split's verification measured in the burst
    }.items():
        e.observe(key, value)
    rng = random.Random(2)
    for i in range(100):  # 10 a second for 10 s
        now[0] = i / 10
        e.observe("latency_ms.split.select", rng.gauss(5_500.0, 500.0))
        e.observe("latency_ms.cloud.select", rng.gauss(450.0, 50.0))
        e.observe("latency_ms.edge.select", rng.gauss(6_000.0, 50.0))
        e.observe("quality.edge.select", 0.0)  # the edge's answers fail: it escalates every time
    return p


def test_a_plan_measured_in_a_burst_is_tried_again_as_its_estimate_ages_and_then_follows_it():
    """Runs S, W and Y of ``benchmarks.capacity``: split measured overloaded, auto ran the cloud plan for
    everything after. Here split's estimate fades while the cloud plan's is fed: its draws reach further
    until one is the fastest; that run's measurement outweighs the burst, and split is chosen from then."""
    now = [10.0]
    p = _burst_then_quiet(now)
    first_split = None
    while now[0] < 10.0 + 20 * TAU_S:
        now[0] += 0.5
        c = _choose(p, "select")
        if c.plan is Plan.SPLIT:
            first_split = now[0]
            break
        p.est.observe(f"latency_ms.{c.plan}.select", 450.0)
    assert first_split is not None and first_split > 10.0 + 3 * TAU_S  # not while the burst is recent
    assert "split: fastest in this draw" in c.reason
    # what the exploring run measured (the cloud idle again): fast; one run outweighs the faded burst
    p.est.observe("verify_ms", 20.0)
    assert p.est.get("verify_ms") < 25.0
    measured = {Plan.SPLIT: 115.0, Plan.CLOUD: 450.0, Plan.EDGE: 2_000.0}
    later = []
    for _ in range(60):
        now[0] += 0.5
        c = _choose(p, "select")
        later.append(c.plan)
        p.est.observe(f"latency_ms.{c.plan}.select", measured[c.plan])
        if c.plan is Plan.SPLIT:
            p.est.observe("verify_ms", 20.0)
    # split from then on, bar the edge's own faded estimate tried again now and then (seeded: 4 of 30)
    assert later[-30:].count(Plan.SPLIT) >= 24 and later[-30:].count(Plan.CLOUD) <= 2


def test_a_plan_measured_slower_than_the_model_predicts_gives_way_to_the_measurement():
    """Word problems under load (capacity, 2026-12-06): the cost model prices load by the cloud's decode speed,
    so it still predicts split (4 decode steps) ahead of the cloud plan (40); split's checks slowed it more, and
    its measured latency says so. The draws centre on what each plan measured."""
    now = [0.0]
    p = _planner(now)
    e = p.est
    for key, value in {
        "step_ms.5": 1.0,
        "prefill_ms_per_token": 0.0,
        "rounds.words": 1.0,
        "rtt_ms": 1.0,
        "refine_ttft_ms": 20.0,
        "refine_ms_per_token": 5.0,
        "decode_steps.split.words": 4.0,
        "decode_steps.cloud.words": 40.0,
        "verify_ms": 30.0,
    }.items():
        e.observe(key, value)
    for i in range(40):  # 10 a second for 4 s
        now[0] = i / 10
        e.observe("latency_ms.split.words", 800.0 + 20 * (i % 3))
        e.observe("latency_ms.cloud.words", 400.0 + 20 * (i % 3))
        e.observe("latency_ms.edge.words", 3_000.0 + 20 * (i % 3))
    c = _choose(p, "words")
    assert c.breakdowns[Plan.SPLIT].total_ms < c.breakdowns[Plan.CLOUD].total_ms  # the model alone says split
    assert [_choose(p, "words").plan for _ in range(30)].count(Plan.CLOUD) >= 29


def test_a_cloud_plan_never_run_is_predicted_from_the_answers_the_task_gets():
    # auto never ran the cloud plan for this task: its length is the task's answers', not the
    # conservative 128-step default that kept auto off it forever (786 ms predicted, 150 measured)
    p = _planner()
    e = p.est
    assert p.shape(task="words", size=SIZE, n=5).cloud_steps == DEFAULTS["decode_steps.cloud"]
    e.observe("answer_tokens.words", 36.0)
    assert p.shape(task="words", size=SIZE, n=5).cloud_steps == 36.0
    e.observe("decode_steps.cloud.words", 41.0)  # measured: the measurement wins
    assert p.shape(task="words", size=SIZE, n=5).cloud_steps == 41.0


def _result(rounds: int, drafting: float, total: float, summary=None) -> EdgeResult:
    drafts = [
        t.Draft(index=i, text="3+5=8; answer 8", num_tokens=10, mean_logprob=-0.1, edge_ms=drafting) for i in range(5)
    ]
    return EdgeResult(
        answer="3+5=8; answer 8",
        source="refined",
        valid=True,
        drafts=drafts,
        summary=summary,
        rounds=rounds,
        timings={"drafting": drafting, "total": total},
    )


def _observe(p: Planner, plan: Plan, result: EdgeResult, edge: EdgeState = WARM, escalated: bool = False) -> None:
    p.observe(plan=plan, task="arith", size=PromptSize(10, 40), n=5, result=result, edge_was=edge, escalated=escalated)


def test_online_updates_from_measured_stage_times():
    p = _planner()
    p.est.observe("prefill_ms_per_token", 0.0)
    cold = dataclasses.replace(WARM, state=ModelState.COLD)
    _observe(p, Plan.EDGE, _result(1, 50.0, 50.0))
    assert p.est.get("step_ms.5") == 5.0  # 50 ms over the longest draft's 10 tokens
    assert p.est.get("latency_ms.edge.arith") == 50.0  # the run's own time
    _observe(p, Plan.EDGE, _result(3, 900.0, 900.0))
    assert p.est.get("step_ms.5") == 5.0  # retry rounds draft at other batch sizes: not a step sample
    _observe(p, Plan.EDGE, _result(1, 80.0, 80.0), cold)
    assert p.est.get("first_run_ms") == 30.0 and p.est.get("step_ms.5") == 5.0  # a fresh session's extra
    summary = t.Summary(
        answer="3+5=8; answer 8",
        source=t.AnswerSource.CLOUD,
        chosen_drafts=[],
        scores=[],
        timings=t.Timings(verify_ms=0.0, refine_ttft_ms=20.0, refine_ms=220.0, total_ms=230.0, decode_steps=40),
        trace="",
        answer_valid=True,
        recommended_drafts=5,
        request_id="",
    )
    _observe(p, Plan.CLOUD, dataclasses.replace(_result(0, 0.0, 300.0, summary), drafts=[]))
    assert p.est.get("decode_steps.cloud.arith") == 40.0 and p.est.get("refine_ms_per_token") == 5.0
    assert p.est.get("refine_ttft_ms") == 20.0 and p.est.has("setup_ms")
    assert p.est.get("quality.cloud.arith") == 1.0
    # a split measures the edge-only answer too: any first-round draft valid (round 2's don't count)
    verdicts = {
        0: t.Verdict(draft_index=0, valid=False),
        1: t.Verdict(draft_index=1, valid=False),
        5: t.Verdict(draft_index=5, valid=True),
    }
    _observe(p, Plan.SPLIT, dataclasses.replace(_result(2, 100.0, 400.0, summary), verdicts=verdicts))
    # the three edge-plan requests above were valid; this one would not have been: mean of 1, 1, 1, 0
    assert p.est.get("quality.split.arith") == 1.0 and p.est.get("quality.edge.arith") == 0.75
    fell_back = dataclasses.replace(_result(1, 10.0, 9_000.0, summary), fallback_reason="cloud failed")
    _observe(p, Plan.SPLIT, fell_back)
    assert p.est.get("latency_ms.split.arith") == 400.0  # a fallback's time is not the plan's


def test_the_clouds_reported_cost_is_learnt_per_plan_and_task_and_a_silent_cloud_teaches_none():
    """``Summary.cost`` (engine tokens the cloud computed for the answer) becomes ``cloud_tokens.<plan>.
    <task>``, a mean over answers (0 is an answer: a draft the rules accept costs the engine nothing);
    the request shape carries it; a cloud that reports no cost leaves the plan unmeasured, not 0."""
    p = _planner()
    assert p.shape(task="arith", size=SIZE, n=5).split_work is None

    def ran(plan: Plan, cost: t.CloudCost | None) -> None:
        summary = t.Summary(
            answer="3+5=8; answer 8", source=t.AnswerSource.CLOUD, timings=t.Timings(total_ms=100.0), cost=cost
        )
        _observe(p, plan, _result(1, 50.0, 200.0, summary))

    ran(Plan.CLOUD, None)
    assert p.shape(task="arith", size=SIZE, n=5).cloud_work is None
    ran(Plan.SPLIT, t.CloudCost(engine_requests=0))  # accepted by the rules
    ran(Plan.SPLIT, t.CloudCost(engine_requests=3, prompt_tokens=300, cached_tokens=100, decoded_tokens=40))
    ran(Plan.CLOUD, t.CloudCost(engine_requests=1, prompt_tokens=60, decoded_tokens=40))
    shape = p.shape(task="arith", size=SIZE, n=5)
    assert shape.split_work == 120.0 and shape.cloud_work == 100.0  # (0 + 240) / 2; 60 + 40
    assert p.shape(task="words", size=SIZE, n=5).split_work is None  # per task
    assert _choose(p).breakdowns[Plan.SPLIT].cloud_work == 120.0  # --explain reports it


def test_an_escalated_request_teaches_the_edge_and_the_split_apart():
    """Auto's edge answer failed the rules and a split refined its drafts: the edge attempt is learnt
    from the edge's own verdict (its failure rate is the chance of escalating), the split as a split of
    its own (the cloud's speeds as any split; its outcomes apart from splits chosen up front)."""
    p = _planner()
    p.est.observe("prefill_ms_per_token", 0.0)
    for _ in range(3):  # the edge's answers have passed the rules so far: it never escalates
        _observe(p, Plan.EDGE, _result(1, 50.0, 50.0))
    assert _choose(p).breakdowns[Plan.EDGE].escalation_p == 0.0
    _observe(p, Plan.EDGE, dataclasses.replace(_result(1, 50.0, 50.0), valid=False, source="edge_only"))
    summary = t.Summary(
        answer="3+5=8; answer 8",
        source=t.AnswerSource.REFINED,
        answer_valid=True,
        timings=t.Timings(
            verify_ms=30.0, refine_ttft_ms=20.0, refine_ms=220.0, total_ms=600.0, decode_steps=40, decode_tokens=40
        ),
    )
    # the cloud rejected the same five drafts, advised a retry round, then refined
    split = dataclasses.replace(
        _result(2, 60.0, 700.0, summary), verdicts={i: t.Verdict(draft_index=i, valid=False) for i in range(5)}
    )
    _observe(p, Plan.SPLIT, split, escalated=True)
    est = p.est
    # the edge plan: 3 valid answers and 1 invalid; the split's first-round verdicts are not counted again
    assert est.get("quality.edge.arith") == 0.75 and est.estimate("quality.edge.arith").weight == 4
    assert est.estimate("draft_tokens.arith").weight == 4  # the drafts were measured once, with the edge attempt
    # the escalation: its own outcomes, and no latency of a plan chosen
    assert est.get("quality.escalated.arith") == 1.0 and est.get("rounds.escalated.arith") == 2.0
    assert est.get("decode_steps.escalated.arith") == 40.0
    assert not any(est.has(k) for k in ("quality.split.arith", "rounds.arith", "latency_ms.split.arith"))
    # the cloud's speeds: learnt from any split
    assert est.get("refine_ms_per_token") == 5.0 and est.get("refine_ttft_ms") == 20.0 and est.has("verify_ms")
    after = _choose(p).breakdowns[Plan.EDGE]
    assert after.escalation_p == 0.25 and after.escalation_cost_ms > 0
    assert after.total_ms == after.attempt_ms + 0.25 * after.escalation_cost_ms
    assert after.quality == 0.75 + 0.25 * 1.0
    # without a cloud there is nothing to escalate to
    assert _choose(p, cloud=False).breakdowns[Plan.EDGE].escalation_p == 0.0


async def test_failed_probes_fall_back_and_say_so(tmp_path):
    import grpc

    from coinfer.edge.planner import probes

    class DownStub:  # the cloud unreachable: every RPC fails as grpc.aio would
        async def Probe(self, *a, **k):  # noqa: N802 - gRPC method names
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")

        Status = Probe  # noqa: N815

    class BrokenLM:
        def step(self, *a):
            raise RuntimeError("session lost")

        def empty_past(self):
            return []

    e = Estimates()
    done = await probes.calibrate(e, tmp_path / "missing.onnx", BrokenLM(), DownStub())
    assert done == []
    for what in ("disk", "decode", "network", "status"):
        assert any(n.startswith(f"{what} probe failed") and "using defaults" in n for n in e.notes), e.notes
    assert e.get("rtt_ms") == DEFAULTS["rtt_ms"]  # conservative default, and the planner still chooses
    assert _choose(Planner(e)).breakdowns
    e.observe("rtt_ms", 12.0)
    await probes.calibrate(e, stub=DownStub())
    assert any("network probe failed" in n and "keeping the last measurement" in n for n in e.notes)


def test_first_run_is_the_first_request_on_a_session_not_the_state():
    p = _planner()
    p.est.observe("prefill_ms_per_token", 0.0)
    p.est.observe("step_ms.5", 5.0)
    fresh = dataclasses.replace(WARM, fresh=True)  # loaded in the background by a cloud request
    assert p.edge_profile(fresh).first_run_ms == p.est.get("first_run_ms") > 0
    assert p.edge_profile(WARM).first_run_ms == 0
    _observe(p, Plan.EDGE, _result(1, 90.0, 90.0), fresh)
    assert p.est.get("first_run_ms") == 40.0 and p.est.get("step_ms.5") == 5.0
