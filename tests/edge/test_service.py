"""EdgeCore.solve around its pipeline (a fake one: no model, no cloud): auto's edge plan escalating
a rule-failing answer reports both plans, learns each with its own outcome, and the cloud's tokens;
auto probes an open circuit once it has cooled down. With the real pipeline, a stand-in draft engine
and a tiny gRPC cloud on 127.0.0.1: a cold edge withdraws what a failed cloud streamed."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import threading
from types import SimpleNamespace

import grpc
import pytest

from coinfer import convert
from coinfer import types as t
from coinfer.edge.config import EdgeConfig
from coinfer.edge.draft_engine import DraftResult
from coinfer.edge.pipeline import EdgePipeline, Plan
from coinfer.edge.planner.estimates import Estimates
from coinfer.edge.result import EdgeResult, ResultBuilder
from coinfer.edge.service import CloudTokens, Done, EdgeCore, SolveRequest
from coinfer.edge.servicer import result_to_pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc
from tests.streams import shown as _shown

ARITH = "If x=3 and y=5, compute x+y."


def _summary(generated: int, prompt: int) -> t.Summary:
    return t.Summary(
        answer="3+5=8; answer 8",
        source=t.AnswerSource.REFINED,
        answer_valid=True,
        replica="10.0.0.7:50051",
        timings=t.Timings(
            verify_ms=20.0,
            refine_ttft_ms=10.0,
            refine_ms=90.0,
            total_ms=150.0,
            decode_steps=generated,
            decode_tokens=generated,
        ),
        prompt_tokens=prompt,
    )


class FakePipeline:
    """Stands in for EdgePipeline: the edge's drafts all fail the rules; a split refines them."""

    calls: list[tuple[Plan, int]] = []

    def __init__(self, engine, channel, replays: int = 2) -> None:
        pass

    async def run(self, request, run):
        plan, drafts = run.plan, run.drafts
        FakePipeline.calls.append((plan, len(drafts or [])))
        if plan is Plan.EDGE:
            out = [t.Draft(index=i, text="3+5=9; answer 9", num_tokens=10) for i in range(3)]
            for d in out:
                run.emit(d)
            return EdgeResult(
                answer=out[0].text,
                source="edge_only",
                valid=False,
                drafts=out,
                rounds=1,
                timings={"drafting": 40.0, "total": 41.0},
            )
        result = ResultBuilder(
            answer="",
            source="",
            valid=False,
            drafts=list(drafts or []),
            rounds=2,
            verdicts={i: t.Verdict(draft_index=i, valid=False) for i in range(3)},
            timings={"drafting": 30.0, "total": 400.0},
        )
        result.take(_summary(generated=42, prompt=17))
        return result.freeze()


@pytest.fixture
def core(tmp_path, monkeypatch) -> EdgeCore:
    monkeypatch.setattr("coinfer.edge.lifecycle.EdgePipeline", FakePipeline)
    FakePipeline.calls = []
    cfg = EdgeConfig(
        model=str(tmp_path),
        warm=False,
        cloud="127.0.0.1:1",
        probe_on_start=False,
        planner_state=str(tmp_path / "p.json"),
    )
    c = EdgeCore(cfg)
    c.engine, c.model_state = SimpleNamespace(providers=["CPUExecutionProvider"], runs=1), "warm"  # no model here
    c.planner.rng = random.Random(0)
    c.planner.est = est = Estimates.open(cfg.planner_state, clock=lambda: 0.0)  # no aging within a test
    est.observe("rtt_ms", 5.0)  # fresh: no background re-probe of a cloud that is not there
    for _ in range(9):  # the edge's answers have passed so far: auto picks it
        est.observe("quality.edge.arith", 1.0)
    est.observe("step_ms.5", 1.0)
    for plan, ms in (("edge", 60.0), ("split", 1_700.0), ("cloud", 1_800.0)):  # run before: spreads known
        for jitter in (0.0, 5.0):
            est.observe(f"latency_ms.{plan}.arith", ms + jitter)
    return c


async def _done(core: EdgeCore, req: SolveRequest) -> tuple[list, Done]:
    events = [ev async for ev in core.solve(req)]
    assert isinstance(events[-1], Done)
    return events, events[-1]


def _ratio_count(core: EdgeCore, plan: str) -> float:
    return core.metrics.registry.get_sample_value("coinfer_edge_plan_latency_ratio_count", {"plan": plan}) or 0.0


async def test_auto_reports_the_plans_that_ran_and_learns_each_with_its_own_outcome(core):
    _, done = await _done(core, SolveRequest(prompt=ARITH, num_drafts=3))
    assert FakePipeline.calls == [(Plan.EDGE, 0), (Plan.SPLIT, 3)]  # escalated with the same drafts
    assert done.plan == "split" and done.plans == ["edge", "split"] and done.result.source == "refined"
    assert "escalated" in done.result.plan_reason
    timings = done.result.timings
    assert timings["escalation"] == 400.0 and timings["total"] == 441.0 and timings["drafting"] == 70.0
    info = done.info()
    assert info["plan"] == "split" and info["plans"] == ["edge", "split"]
    assert info["cloud_tokens"] == {"generated": 42, "prompt": 17}
    assert info["predicted_ms"]["total_ms"] == pytest.approx(info["predicted_ms"]["attempt_ms"])  # p was 0
    est = core.planner.est
    # the edge plan learnt from the edge's own verdict (9 passes, 1 failure), not from the cloud's answer
    assert est.get("quality.edge.arith") == pytest.approx(0.9) and est.estimate("quality.edge.arith").weight == 10
    assert est.get("quality.escalated.arith") == 1.0 and not est.has("quality.split.arith")
    assert _ratio_count(core, "edge") == 1 and _ratio_count(core, "split") == 1  # each against its own prediction
    assert (
        core.metrics.registry.get_sample_value("coinfer_edge_requests_total", {"plan": "split", "source": "refined"})
        == 1
    )
    # the next choice sees the escalation coming
    size = core.planner.prompt_size(ARITH)
    nxt = core.planner.choose(task="arith", size=size, n=3, edge=core.edge_state(), cloud_available=True)
    nxt = nxt.breakdowns["edge"]
    assert nxt.escalation_p == pytest.approx(0.1) and nxt.escalation_cost_ms > 0


def test_a_result_is_immutable_and_owns_what_its_run_filled_in():
    import dataclasses

    built = ResultBuilder(answer="", source="edge_only", valid=False, timings={"drafting": 1.0})
    built.take(_summary(generated=42, prompt=17))
    r = built.freeze()
    built.timings["total"] = 9.0  # the builder goes on; the frozen result does not follow
    assert r.source == "refined" and r.valid and "total" not in r.timings
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.answer = "x"  # type: ignore[misc]


async def test_a_plan_asked_for_runs_alone_and_the_cloud_costs_nothing_when_unused(core):
    _, done = await _done(core, SolveRequest(prompt=ARITH, num_drafts=3, plan="edge"))
    assert FakePipeline.calls == [(Plan.EDGE, 0)]  # no escalation outside auto
    info = done.info()
    assert info["plans"] == ["edge"] and info["plan"] == "edge" and not info["valid"]
    assert info["cloud_tokens"] == {"generated": 0, "prompt": 0}


def test_the_grpc_result_carries_the_plans_and_the_cloud_tokens():
    built = ResultBuilder(answer="8", source="refined", valid=True, task="arith")
    built.take(_summary(generated=42, prompt=17))
    r = built.freeze()
    edge = EdgeResult(answer="9", source="edge_only", valid=False)
    done = Done(result=r, plan="split", plans=["edge", "split"], cloud_tokens=CloudTokens.of([edge, r, r]))
    msg = result_to_pb(done)
    assert list(msg.plans) == ["edge", "split"] and msg.plan == "split" and msg.replica == "10.0.0.7:50051"
    assert (msg.cloud_tokens.generated, msg.cloud_tokens.prompt) == (84, 34)  # summed over sessions
    alone = result_to_pb(Done(result=edge, plan="edge"))  # no list given: the plan that ran
    assert list(alone.plans) == ["edge"] and (alone.cloud_tokens.generated, alone.cloud_tokens.prompt) == (0, 0)


class PassingEdgePipeline(FakePipeline):
    """The edge's answer passes the rules: no escalation, so auto reaches the cloud only by choosing it."""

    async def run(self, request, run):
        r = await super().run(request, run)
        return dataclasses.replace(r, answer="3+5=8; answer 8", valid=True) if run.plan is Plan.EDGE else r


async def test_auto_probes_an_open_circuit_once_it_has_cooled_down(core, monkeypatch):
    monkeypatch.setattr("coinfer.edge.lifecycle.EdgePipeline", PassingEdgePipeline)
    breaker, now = core.link.breaker, [0.0]
    breaker.clock = lambda: now[0]
    breaker.health(False)  # the cloud went away (no health watch runs here to see it come back)
    req = SolveRequest(prompt=ARITH, num_drafts=3)
    _, done = await _done(core, req)
    assert done.plans == ["edge"] and breaker.state is t.BreakerState.OPEN  # cooling down: the cloud is not offered
    now[0] = breaker.reset_s
    _, done = await _done(core, req)  # offered, but auto still prefers the edge (its answers pass)
    assert done.plans == ["edge"] and breaker.state is t.BreakerState.OPEN  # the half-open trial is not taken
    for _ in range(20):  # now they fail: auto wants the cloud
        core.planner.est.observe("quality.edge.arith", 0.0)
    _, done = await _done(core, req)
    assert done.plans[0] in ("split", "cloud")  # the trial request, the only way back to the cloud
    assert FakePipeline.calls[-1][0] is not Plan.EDGE and breaker.state is t.BreakerState.CLOSED


async def test_the_planners_estimates_are_written_off_the_event_loop(core, monkeypatch):
    """Issue 51: the edge wrote its estimates file on the event loop after every request it learnt from. The
    write is held until the loop has run something else: on the loop, that never happens, and every other
    request waits for the disk."""
    order: list[str] = []
    ticked = threading.Event()
    real_replace = os.replace

    def held_replace(src, dst):
        if str(dst) != core.cfg.planner_state:  # another test's core, writing late
            return real_replace(src, dst)
        order.append("write")
        ticked.wait(timeout=30)  # a hang guard only: released at once when the loop runs
        order.append("written")
        real_replace(src, dst)

    async def other_request() -> None:
        while "write" not in order:
            await asyncio.sleep(0.001)
        order.append("the loop ran")
        ticked.set()

    monkeypatch.setattr(os, "replace", held_replace)
    other = asyncio.create_task(other_request())
    await _done(core, SolveRequest(prompt=ARITH, num_drafts=3))
    await asyncio.wait_for(other, 30)
    await core.planner.est.flush()
    assert order[:3] == ["write", "the loop ran", "written"]
    assert core.cfg.planner_state and os.path.exists(core.cfg.planner_state)


class FailsMidAnswer(pb_grpc.CoinferCloudServicer):
    """A cloud whose answer stops halfway: two chunks streamed, then the replica fails."""

    async def Generate(self, request, context):
        for text in ("3+5=", "9"):
            yield convert.event_to_pb(t.AnswerChunk(text))
        await context.abort(grpc.StatusCode.INTERNAL, "the engine died mid-answer")


class LocalDrafts:
    """Stands in for the draft engine the cold edge loads once the cloud has failed."""

    providers, runs = ["CPUExecutionProvider"], 0
    identity = "sha256:stand-in"

    def render(self, messages) -> str:
        return messages[-1].content

    def generate(self, prompt, s, on_draft=None, cancelled=None, greedy=0, greedy_tokens=0) -> list[DraftResult]:
        out = [
            DraftResult(
                index=i,
                text="3+5=8; answer 8",
                token_ids=[1] * 10,
                mean_logprob=-0.1,
                edge_ms=1.0,
                finish_reason="stop",
            )
            for i in range(s.n)
        ]
        for d in out:
            on_draft(d)
        return out


async def test_a_cold_edge_withdraws_a_failed_clouds_streamed_text_before_answering_locally(core, monkeypatch):
    monkeypatch.setattr("coinfer.edge.lifecycle.EdgePipeline", EdgePipeline)  # the real pipeline this time
    server = grpc.aio.server()
    pb_grpc.add_CoinferCloudServicer_to_server(FailsMidAnswer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    core.engine, core.model_state, core.cfg.replays = None, t.ModelState.COLD, 0  # cold; no replica to replay on

    async def load() -> LocalDrafts:
        core.engine = core.engine or LocalDrafts()
        return core.engine

    monkeypatch.setattr(core, "ensure_engine", load)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            core.link.channel = ch
            events, done = await _done(core, SolveRequest(prompt=ARITH, num_drafts=3, plan="cloud"))
    finally:
        await server.stop(None)
    assert done.result.fallback_reason.startswith("INTERNAL") and done.result.answer == "3+5=8; answer 8"
    assert [e.text for e in events if isinstance(e, t.AnswerChunk)][:2] == ["3+5=", "9"]  # the cloud's, then withdrawn
    assert _shown(events) == done.result.answer


def test_the_circuit_gauge_follows_the_breaker_between_requests(core):
    # the health watch moves the breaker between requests: /metrics says so at once (the gauge was set
    # only at a request's end), and counts each move by the state it moved to
    sample = core.metrics.registry.get_sample_value
    core.link.breaker.health(False)
    assert sample("coinfer_edge_cloud_circuit_open") == 1
    core.link.breaker.health(True)
    core.link.breaker.health(True)  # no move
    assert sample("coinfer_edge_cloud_circuit_open") == 0
    assert sample("coinfer_edge_cloud_circuit_changes_total", {"state": "open"}) == 1
    assert sample("coinfer_edge_cloud_circuit_changes_total", {"state": "closed"}) == 1
