"""RequestLifecycle (edge/lifecycle.py): the plan it decides (the one asked for, the cloud skipped with
its kind), the breaker fed with what counts against the cloud, and a cloud plan whose deadline passes
after final text left: the edge continues that text, so the stream, the whole answer and gRPC agree.
The real pipeline, a stand-in draft engine and a tiny gRPC cloud on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import pytest

from coinfer import convert
from coinfer import types as t
from coinfer.edge.config import EdgeConfig
from coinfer.edge.draft_engine import DraftResult
from coinfer.edge.http import create_app
from coinfer.edge.kinds import FallbackKind, RequestedPlan
from coinfer.edge.lifecycle import RequestLifecycle
from coinfer.edge.pipeline import Plan
from coinfer.edge.request import SolveRequest, checked
from coinfer.edge.service import Done, EdgeCore
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc
from tests.streams import shown

QUESTION = "Why is the sky blue?"
STREAMED = ("Rayleigh", " scattering")
"""What the cloud streams as final before it stalls."""
CONTINUED = " makes the sky blue."
"""What the edge's drafts write after the streamed text."""
ALONE = "The sea reflects it."
"""What the edge's drafts write from the question alone (the cloud plan's hedge)."""


class StallsAfterFinalText(pb_grpc.CoinferCloudServicer):
    """A cloud that streams final text, then stalls past the request's deadline."""

    async def Generate(self, request, context):
        for text in STREAMED:
            yield convert.event_to_pb(t.AnswerChunk(text, final=True))
        await asyncio.sleep(30)


class Drafts:
    """Stands in for the warm draft engine: a prompt that ends with the streamed text is continued."""

    providers, runs = ["CPUExecutionProvider"], 1

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def render(self, messages) -> str:
        return f"User: {messages[-1].content}\nAssistant:"

    def generate(self, prompt, s, on_draft=None, cancelled=None) -> list[DraftResult]:
        self.prompts.append(prompt)
        text = CONTINUED if prompt.endswith("".join(STREAMED)) else ALONE
        out = [DraftResult(i, text, [1] * 5, -0.1 * (i + 1), 1.0, "stop") for i in range(s.n)]
        for d in out:
            if on_draft is not None:
                on_draft(d)
        return out


def _core(tmp_path, cloud: str = "127.0.0.1:1") -> EdgeCore:
    c = EdgeCore(EdgeConfig(model=str(tmp_path), warm=False, cloud=cloud, probe_on_start=False))
    c.engine, c.model_state = Drafts(), t.ModelState.WARM
    c.planner.est.observe("rtt_ms", 5.0)  # fresh: no background re-probe of a cloud that is not there
    c.usage = lambda req, done: {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "draft_tokens": 0}
    return c


@pytest.fixture
async def stalling(tmp_path):
    server = grpc.aio.server()
    pb_grpc.add_CoinferCloudServicer_to_server(StallsAfterFinalText(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    core = _core(tmp_path)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        core.link.channel = ch
        yield core
    await server.stop(None)


async def test_a_cloud_deadline_after_final_text_streamed_continues_that_text_on_the_edge(stalling):
    """Issue 35's leftover: text that left over HTTP cannot be withdrawn, so the local answer after the
    cloud's deadline continues it (before: the hedge's own answer, and the stream ended in an error)."""
    core = stalling
    coinfer = {"plan": "cloud", "deadline_ms": 1500}
    body = {"model": core.cfg.model_name, "messages": [{"role": "user", "content": QUESTION}], "coinfer": coinfer}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(core)), base_url="http://edge") as http:
        r = await http.post("/v1/chat/completions", json=body | {"stream": True})
        events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        whole = (await http.post("/v1/chat/completions", json=body)).json()
    assert not [e for e in events if "error" in e], events
    content = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    content = [c for c in content if c]
    answer = "".join(STREAMED) + CONTINUED
    assert content == [*STREAMED, CONTINUED]  # sent at once, never withdrawn, then the edge's continuation
    last = events[-1]
    assert last["coinfer"]["answer"] == answer and last["choices"][0]["finish_reason"] == "stop"
    assert last["coinfer"]["source"] == "edge_only" and last["coinfer"]["fallback_reason"].startswith("DEADLINE")
    assert whole["choices"][0]["message"]["content"] == answer == whole["coinfer"]["answer"]
    assert whole["choices"][0]["finish_reason"] == "stop"
    # gRPC Solve: the client that honours resets ends on the same text as Done's answer
    grpc_events = [ev async for ev in core.solve(SolveRequest(prompt=QUESTION, plan="cloud", deadline_ms=1500))]
    done = grpc_events[-1]
    assert isinstance(done, Done) and done.result.answer == answer == shown(grpc_events)
    assert done.result.fallback_kind is FallbackKind.DEADLINE and not done.result.fallback_kind.counts_against_cloud
    assert core.link.breaker.state is t.BreakerState.CLOSED  # a request's deadline is not the cloud's fault


def _request(core: EdgeCore, **kw):
    return checked(SolveRequest(prompt="If x=3 and y=5, compute x+y.", num_drafts=3, **kw), core.cfg, 5)


def test_a_plan_asked_for_is_the_plan_run_and_its_reason_says_so(tmp_path):
    core = _core(tmp_path)
    for asked in (RequestedPlan.EDGE, RequestedPlan.SPLIT, RequestedPlan.CLOUD):
        d = RequestLifecycle(core, _request(core, plan=asked.value)).decide()
        assert d.plan is asked.plan and d.why == "requested" and d.skipped is None and d.choice is None


def test_the_daemons_plan_stands_in_for_auto(tmp_path):
    core = _core(tmp_path)
    core.cfg.plan = RequestedPlan.SPLIT
    d = RequestLifecycle(core, _request(core)).decide()
    assert d.plan is Plan.SPLIT and d.choice is None


def test_a_skipped_cloud_is_named_by_kind(tmp_path):
    alone = EdgeCore(EdgeConfig(model=str(tmp_path), warm=False, probe_on_start=False))
    d = RequestLifecycle(alone, _request(alone, plan="split")).decide()
    assert (d.plan, d.skipped, d.skip_reason) == (Plan.EDGE, FallbackKind.NO_CLOUD, "no cloud configured")
    core = _core(tmp_path)
    core.link.breaker.health(False)  # open, cooling down
    d = RequestLifecycle(core, _request(core, plan="cloud")).decide()
    assert (d.plan, d.skipped) == (Plan.EDGE, FallbackKind.CIRCUIT_OPEN) and "open" in d.skip_reason
    assert not FallbackKind.CIRCUIT_OPEN.counts_against_cloud


async def test_a_skipped_clouds_answer_is_local_and_says_why(tmp_path):
    core = _core(tmp_path)
    core.link.breaker.health(False)
    events = [ev async for ev in core.solve(SolveRequest(prompt=QUESTION, plan="split", num_drafts=2))]
    done = events[-1]
    assert done.plans == [Plan.EDGE] and done.result.answer == ALONE and shown(events) == ALONE
    assert (
        done.result.fallback_kind is FallbackKind.CIRCUIT_OPEN and done.result.fallback_reason == "cloud circuit open"
    )
    assert done.result.finish_reason is t.FinishReason.STOP
    assert core.metrics.registry.get_sample_value("coinfer_edge_fallbacks_total", {"reason": "CIRCUIT_OPEN"}) == 1


def test_a_plan_the_request_names_wrongly_is_refused_naming_the_field(tmp_path):
    from coinfer.errors import InvalidArgument

    core = _core(tmp_path)
    with pytest.raises(InvalidArgument) as err:
        _request(core, plan="moon")
    assert err.value.field == "plan" and "auto, edge, split, cloud" in err.value.message


def test_the_checked_request_carries_its_compiled_rules_and_sampling(tmp_path):
    core = _core(tmp_path)
    r = _request(core, plan="edge", deadline_ms=2500)
    assert r.req.task == "arith" and r.task.name == "arith" and r.ruleset.task is r.task
    assert r.sampling.n == 3 and r.deadline_s == 2.5 and r.plan is RequestedPlan.EDGE


def test_a_request_is_parsed_and_its_rules_compiled_once(tmp_path, monkeypatch):
    from coinfer.rules import RuleSet
    from coinfer.tasks import TASKS

    calls = {"parse": 0, "compile": 0}
    arith, parse = TASKS["arith"], TASKS["arith"].parse_problem

    def counted_parse(prompt):
        calls["parse"] += 1
        return parse(prompt)

    class CountedRuleSet(RuleSet):
        def __init__(self, *a, **kw):
            calls["compile"] += 1
            super().__init__(*a, **kw)

    monkeypatch.setattr(arith, "parse_problem", counted_parse)
    monkeypatch.setattr("coinfer.edge.request.RuleSet", CountedRuleSet)
    core = _core(tmp_path)
    r = _request(core, plan="edge")  # no task named: inferred, and the inference's parse is kept
    assert r.req.task == "arith" and calls == {"parse": 1, "compile": 1}
