"""RequestLifecycle (edge/lifecycle.py): the plan it decides (the one asked for, the cloud skipped with
its kind), the breaker fed with what counts against the cloud, a cloud plan whose deadline passes
after final text left (the edge continues that text, so the stream, the whole answer and gRPC agree),
and a cloud that fails mid-session with the edge warm: the pipeline reports ``CloudFailed`` with what
the run had and the lifecycle answers locally (the drafts written before a replay, the hedge's), feeds
the breaker and the planner. The real pipeline, a stand-in draft engine and a tiny gRPC cloud on
127.0.0.1."""

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
from coinfer.edge.result import EdgeResult
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
    identity = "sha256:stand-in"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def render(self, messages) -> str:
        return f"User: {messages[-1].content}\nAssistant:"

    def generate(self, prompt, s, on_draft=None, cancelled=None, greedy=0, greedy_tokens=0) -> list[DraftResult]:
        self.prompts.append(prompt)
        text = CONTINUED if prompt.endswith("".join(STREAMED)) else ALONE
        out = [
            DraftResult(
                index=i, text=text, token_ids=[1] * 5, mean_logprob=-0.1 * (i + 1), edge_ms=1.0, finish_reason="stop"
            )
            for i in range(s.n)
        ]
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


async def _cloud(servicer: pb_grpc.CoinferCloudServicer):
    server = grpc.aio.server()
    pb_grpc.add_CoinferCloudServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _events(core: EdgeCore, cloud: pb_grpc.CoinferCloudServicer, req: SolveRequest) -> list:
    """The request's events from ``core`` with ``cloud`` as its cloud."""
    server, target = await _cloud(cloud)
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            core.link.channel = ch
            return [ev async for ev in core.solve(req)]
    finally:
        await server.stop(None)


class FailsMidSession(pb_grpc.CoinferCloudServicer):
    """A split session that accepts, reads every draft, streams part of an answer (not final), then its
    replica fails: every session, so a replay fails too."""

    def __init__(self) -> None:
        self.sessions: list[int] = []
        """The drafts each session received."""

    async def Session(self, request_iterator, context):
        yield convert.event_to_pb(t.SessionAccepted("", [], 5))
        drafts = 0
        async for msg in request_iterator:
            if msg.HasField("draft"):
                drafts += 1
            elif msg.HasField("done"):
                break
        self.sessions.append(drafts)
        yield convert.event_to_pb(t.AnswerChunk("Blue light"))
        await context.abort(grpc.StatusCode.INTERNAL, "the engine died mid-answer")


def _observed(core: EdgeCore, monkeypatch) -> list[tuple[str, EdgeResult]]:
    """What the planner is told: (plan, result) per plan that ran."""
    seen: list[tuple[str, EdgeResult]] = []
    observe = core.planner.observe

    def spy(*, plan, result, **kw):
        seen.append((plan, result))
        observe(plan=plan, result=result, **kw)

    monkeypatch.setattr(core.planner, "observe", spy)
    return seen


async def test_a_warm_edge_answers_a_mid_session_failure_from_the_drafts_written_before_the_replay(
    tmp_path, monkeypatch
):
    """The split's session fails after streaming part of an answer; the replay on another replica (the
    same one here) fails too. The lifecycle answers from the drafts the run wrote (no drafting again),
    after withdrawing the streamed text, counts the failure against the cloud and tells the planner."""
    cloud = FailsMidSession()
    core = _core(tmp_path)
    core.cfg.replays, core.link.breaker.failures = 1, 1
    seen = _observed(core, monkeypatch)
    events = await _events(core, cloud, SolveRequest(prompt=QUESTION, plan="split", num_drafts=3))
    done = events[-1]
    r = done.result
    assert isinstance(done, Done) and done.plans == [Plan.SPLIT] and cloud.sessions == [3, 3]  # replayed, same drafts
    assert core.engine.prompts == [QUESTION_PROMPT]  # drafted once: the local answer is chosen from those drafts
    assert r.answer == ALONE and r.source == "edge_only" and r.summary is None and len(r.drafts) == 3
    # an abort with no coinfer reason: a transport failure, its status kept apart
    assert r.fallback_kind is FallbackKind.TRANSPORT and r.fallback_reason.startswith("INTERNAL")
    assert r.fallback_status == "INTERNAL" and len(r.replays) == 1 and r.replays[0].startswith("INTERNAL")
    # the events: the drafts, the cloud's partial answer withdrawn at the replay and again at the fallback,
    # then the local answer whole
    kinds = [type(e).__name__ for e in events if not isinstance(e, (t.Draft, t.SessionAccepted))]
    assert kinds == ["AnswerChunk", "AnswerReset", "AnswerChunk", "AnswerReset", "AnswerChunk", "Done"]
    assert [e.text for e in events if isinstance(e, t.AnswerChunk)] == ["Blue light", "Blue light", ALONE]
    assert shown(events) == r.answer
    # the breaker counts it (the cloud's fault, not the request's); the planner learns the split's drafts
    assert core.link.breaker.state is t.BreakerState.OPEN and core.link.breaker.why == r.fallback_reason
    assert [(plan, res.fallback_kind) for plan, res in seen] == [("split", FallbackKind.TRANSPORT)]
    assert [d.text for d in seen[0][1].drafts] == [ALONE] * 3
    assert core.metrics.registry.get_sample_value("coinfer_edge_fallbacks_total", {"reason": "TRANSPORT"}) == 1
    changes = {"state": "open"}
    assert core.metrics.registry.get_sample_value("coinfer_edge_cloud_circuit_changes_total", changes) == 1


QUESTION_PROMPT = f"User: {QUESTION}\nAssistant:"


class FailsAfterAStall(pb_grpc.CoinferCloudServicer):
    """A cloud plan's answer that stalls after a first (not final) chunk, then fails."""

    async def Generate(self, request, context):
        yield convert.event_to_pb(t.AnswerChunk("Rayleigh"))
        await asyncio.sleep(0.4)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "replica lost")


async def test_a_cloud_plans_failure_takes_the_hedges_drafts(tmp_path, monkeypatch):
    """Under the cloud plan the hedge drafts from its reserve before the deadline on; a failure after it
    started hands its drafts to the lifecycle, which answers from them (no round of its own)."""
    core = _core(tmp_path)
    core.cfg.replays = 0
    monkeypatch.setattr(RequestLifecycle, "_local_reserve_s", lambda self, d: 10.0)  # the hedge starts at once
    seen = _observed(core, monkeypatch)
    events = await _events(core, FailsAfterAStall(), SolveRequest(prompt=QUESTION, plan="cloud", deadline_ms=3000))
    r = events[-1].result
    assert core.engine.prompts == [QUESTION_PROMPT]  # the hedge's round only
    assert r.answer == ALONE == shown(events) and (r.fallback_kind, r.fallback_status) == ("TRANSPORT", "UNAVAILABLE")
    assert [type(e).__name__ for e in events[:-1]] == ["AnswerChunk", "AnswerReset", "AnswerChunk"]
    assert core.link.breaker.state is t.BreakerState.CLOSED  # one failure of three
    assert [(p, len(res.drafts)) for p, res in seen] == [("cloud", 5)]


async def test_the_planner_sees_a_continuations_own_text_and_tokens(stalling, monkeypatch):
    """A local answer after streamed final text continues it: the user's drafts carry the whole text,
    the planner's only what the edge wrote (text and token count agree: its bytes per token)."""
    core = stalling
    seen = _observed(core, monkeypatch)
    events = [ev async for ev in core.solve(SolveRequest(prompt=QUESTION, plan="cloud", deadline_ms=1500))]
    r = events[-1].result
    whole = "".join(STREAMED) + CONTINUED
    assert r.answer == whole and {d.text for d in r.drafts} == {whole} and set(r.continued) == {0, 1, 2, 3, 4}
    assert [d.text for d in r.written_drafts()] == [CONTINUED] * 5
    ((plan, learned),) = seen
    assert plan == "cloud" and [(d.text, d.num_tokens) for d in learned.drafts] == [(CONTINUED, 5)] * 5


async def test_the_pipeline_reports_a_failed_cloud_with_what_the_run_had(tmp_path):
    """The pipeline decides no local answer: its run raises CloudFailed with the partial result, the
    drafts written before the replay and the failure as data; the user has seen the reset of the replay."""
    from coinfer.edge.failures import CloudFailed
    from coinfer.edge.pipeline import EdgePipeline, Run

    cloud = FailsMidSession()
    server, target = await _cloud(cloud)
    core = _core(tmp_path)
    request = _request(core, plan="split")
    run = Run(plan=Plan.SPLIT, deadline_s=5.0)
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            with pytest.raises(CloudFailed) as err:
                await EdgePipeline(core.engine, ch, replays=1).run(request, run)
    finally:
        await server.stop(None)
    failed = err.value
    assert (failed.kind, failed.status, failed.standby) == (FallbackKind.TRANSPORT, "INTERNAL", None)
    assert [d.index for d in failed.written] == [0, 1, 2] and len(failed.partial.replays) == 1
    assert [d.index for d in failed.partial.drafts] == [0, 1, 2] and failed.partial.answer == ""
    assert run.shown.text == "Blue light" and core.engine.prompts == [
        QUESTION_PROMPT.replace(QUESTION, request.req.prompt)
    ]


class EndsWithoutASummary(pb_grpc.CoinferCloudServicer):
    """A cloud plan's answer stream that ends cleanly (status OK) after a first, not final, chunk: no Summary."""

    def __init__(self) -> None:
        self.calls = 0

    async def Generate(self, request, context):
        self.calls += 1
        yield convert.event_to_pb(t.AnswerChunk("Rayleigh"))


async def test_a_cloud_plans_stream_that_ends_without_a_summary_is_a_failure_not_an_empty_answer(tmp_path):
    """Like the split's session: a Generate stream that ends without its Summary is replayed, then answered
    locally with the reason (it was an empty cloud answer: no text, no fallback reason, the breaker told
    the cloud had succeeded)."""
    cloud = EndsWithoutASummary()
    core = _core(tmp_path)
    core.cfg.replays, core.link.breaker.failures = 1, 1
    events = await _events(core, cloud, SolveRequest(prompt=QUESTION, plan="cloud", deadline_ms=5000))
    r = events[-1].result
    assert cloud.calls == 2 and len(r.replays) == 1  # replayed once, then the local answer
    assert r.answer == ALONE == shown(events) and r.source == "edge_only"
    assert r.fallback_kind is FallbackKind.UNAVAILABLE and "ended without a summary" in r.fallback_reason
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["AnswerChunk", "AnswerReset", "AnswerChunk", "AnswerReset", "AnswerChunk", "Done"]
    assert core.link.breaker.state is t.BreakerState.OPEN  # the cloud's fault


class AnswersSlowly(pb_grpc.CoinferCloudServicer):
    """A cloud plan's answer: a first final chunk, then the rest much later."""

    async def Generate(self, request, context):
        yield convert.event_to_pb(t.AnswerChunk("Rayleigh", final=True))
        await asyncio.sleep(3600)


async def test_closing_a_requests_events_cancels_its_cloud_call_before_the_close_returns(tmp_path, monkeypatch):
    """The front end closes a request's events when its client leaves (``edge/http.py``): the run is
    cancelled, its cloud call with it, and waited for, before the close returns (the lifecycle's generator
    was left running under EdgeCore.solve's, and its run was cancelled without being waited for)."""
    from coinfer.edge.remote import Remote

    log: list[str] = []
    cloud_only = Remote._cloud_only

    async def watched(self, deadline_s):
        try:
            return await cloud_only(self, deadline_s)
        except asyncio.CancelledError:
            log.append("cloud call cancelled")
            raise

    monkeypatch.setattr(Remote, "_cloud_only", watched)
    core = _core(tmp_path)
    server, target = await _cloud(AnswersSlowly())
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            core.link.channel = ch
            events = core.solve(SolveRequest(prompt=QUESTION, plan="cloud", deadline_ms=30_000))
            async for ev in events:
                if isinstance(ev, t.AnswerChunk):
                    break
            await events.aclose()
            log.append("events closed")
    finally:
        await server.stop(None)
    assert log == ["cloud call cancelled", "events closed"] and core.active == 0


class WritesNothing(Drafts):
    """A draft model that ends every draft at once (an end-of-turn first, or a budget spent)."""

    def generate(self, prompt, s, on_draft=None, cancelled=None, greedy=0, greedy_tokens=0) -> list[DraftResult]:
        out = [
            DraftResult(index=i, text="", token_ids=[], mean_logprob=0.0, edge_ms=1.0, finish_reason="stop")
            for i in range(s.n)
        ]
        for d in out:
            if on_draft is not None:
                on_draft(d)
        return out


async def test_an_empty_local_answer_streams_no_empty_chunk(tmp_path):
    """A local answer arrives as one chunk; an empty one was an empty chunk (a Node grpc-js client saw
    ``chunk {text: ""}`` before the result, for a request whose 1 ms deadline left no time to draft)."""
    core = _core(tmp_path)
    core.engine = WritesNothing()
    events = [ev async for ev in core.solve(SolveRequest(prompt=QUESTION, plan="edge"))]
    assert not [e for e in events if isinstance(e, t.AnswerChunk)], events
    assert isinstance(events[-1], Done) and events[-1].result.answer == ""
