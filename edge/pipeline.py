"""The edge's request pipeline: draft locally, stream drafts over a cloud session,
follow retry advice, and fall back to the best local draft if the cloud fails.

Plans: ``split`` (drafts -> cloud verify + refine), ``edge`` (drafts + local
rules only), ``cloud`` (the cloud answers alone). Drafting runs in a worker
thread (ONNX Runtime blocks); each finished draft is handed to the event loop
and written to the session at once, so the cloud verifies early drafts while
later ones are still being written.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from coinfer import convert
from coinfer import types as t
from coinfer.chat import ChatMessage
from coinfer.edge.draft_engine import DraftResult, OrtDraftEngine
from coinfer.edge.sampling import Sampling
from coinfer.errors import InvalidArgument, Reason, ResourceExhausted, error_info
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import get_task
from coinfer.types import Plan  # noqa: F401 - re-exported: callers name the plan with the pipeline
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


def request_fault(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a cloud error is the request's own fault (the user gets it) rather than the cloud's
    (the user gets a local answer flagged with the reason). A full cloud (``SESSIONS_FULL``) and a
    refused token are the cloud's or the operator's problem, not a bad request; an input over a
    per-request limit (a named field) is the request's."""
    code = exc.code()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return True
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and error_info(exc)[0] != Reason.SESSIONS_FULL


def failure_kind(exc: BaseException) -> str:
    """A cloud failure as data: the server's ``ErrorInfo`` reason (``coinfer.errors.Reason``), else
    the status code's name; a deadline, the cloud's or the edge's own, is ``DEADLINE``."""
    if isinstance(exc, grpc.aio.AioRpcError):
        reason = error_info(exc)[0]
        if reason:
            return reason
        return Reason.DEADLINE if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else exc.code().name
    return Reason.DEADLINE if isinstance(exc, TimeoutError) else Reason.UNAVAILABLE


def cloud_failed(kind: str) -> bool:
    """Whether a fallback (its ``failure_kind``) counts against the cloud in the circuit breaker. Not a
    full cloud (all sessions, or this edge's quota, in use: load) and not a request's own deadline
    running out (a client asking for 50 ms would otherwise switch the cloud off for everyone; a hung
    engine is caught by the cloud's heartbeat and shows as NOT_SERVING)."""
    return kind not in (Reason.SESSIONS_FULL, Reason.DEADLINE)


LOCAL_FINISH_S = 0.1
"""Local drafting stops this long before the request's deadline: the rules and the reply fit in it."""
SPLIT_VERIFY_RESERVE_S = 0.5
"""Split drafting stops this long (at most 15% of it) before the cloud's deadline: its verification."""
LATE_DRAFT_S = 0.5
"""A fallback that starts after the deadline still drafts this long (an answer rather than none)."""
CLOUD_MARGIN_S = 0.3
"""The cloud's deadline is this much (at most a tenth of the request's) shorter than the edge's: the
cloud's best answer at its deadline travels back before the edge stops waiting."""
REPLAYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
)
"""Cloud failures a session survives by replaying on another replica: killed or draining (UNAVAILABLE),
cancelled by a stopping server, full (RESOURCE_EXHAUSTED "sessions:"; a request over a limit is the
request's fault, never replayed), a transport broken mid-stream (INTERNAL "Internal error from Core",
seen when a replica died under load) or a replica's own fault (INTERNAL / UNKNOWN: another replica
may not share it; the replay budget bounds a fault they all share)."""


def failure_reason(exc: BaseException) -> str:
    """A cloud failure as the user's fallback reason: a status code and what happened, never a class name."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, TimeoutError):
        return "DEADLINE_EXCEEDED: the cloud did not answer within the request's deadline"
    return f"UNAVAILABLE: {exc}" if str(exc) else "UNAVAILABLE: the cloud session ended early"


def replayable(exc: BaseException) -> bool:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in REPLAYABLE and not request_fault(exc)
    return isinstance(exc, ConnectionError)  # the stream ended without a summary


def follow_advice(s: Sampling, advice: t.RetryAdvice) -> Sampling:
    """The next round's sampling: the cloud's exploration knobs (hotter, more penalised, more drafts),
    the user's own limits (token budget, stop strings, seed) kept."""
    a = advice.sampling
    return dataclasses.replace(
        s,
        n=advice.num_drafts,
        temperature=a.temperature,
        top_p=a.top_p,
        presence_penalty=a.presence_penalty,
        frequency_penalty=a.frequency_penalty,
        max_new_tokens=min(s.max_new_tokens, a.max_new_tokens),
    )


class CloudFailed(ConnectionError):
    """The cloud failed a request and no edge model is loaded to answer it locally."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind
        """The failure as data (``failure_kind``)."""


@dataclass(frozen=True)
class EdgeResult:
    """What the application gets back: one immutable result per run of a plan (the pipeline fills a
    ``ResultBuilder`` while it runs; later layers add to a result with ``dataclasses.replace``)."""

    answer: str
    source: t.ResultSource
    valid: bool
    drafts: list[t.Draft] = field(default_factory=list)
    verdicts: dict[int, t.Verdict] = field(default_factory=dict)
    summary: t.Summary | None = None
    rounds: int = 0
    fallback_reason: str = ""
    fallback_kind: str = ""
    """The fallback's cause as data (``failure_kind``, or ``NO_CLOUD`` / ``CIRCUIT_OPEN`` when the
    cloud was skipped): what the breaker and the metrics decide on; ``fallback_reason`` is for people."""
    timings: dict[str, float] = field(default_factory=dict)
    """ms: first_draft, drafting (all rounds), total; after an escalation also ``escalation`` (the
    split's own time; drafting and total then cover the edge attempt and the split)."""
    predicted: dict[str, float] = field(default_factory=dict)
    """The planner's predicted breakdown (ms) for the plan it chose: ``total_ms`` its expectation
    (auto's edge plan: ``attempt_ms`` plus ``escalation_ms``, the escalation's chance times its cost)."""
    plan_reason: str = ""
    task: str = ""
    """The task preset that ran ("" = open request)."""
    fields: dict = field(default_factory=dict)
    """Fields extracted from the answer."""
    refine_mode: str = ""
    """How the cloud's refinement used the drafts (candidates | prefix | alone); "" = none."""
    replays: list[str] = field(default_factory=list)
    """Why each replay on another replica happened (a session that failed before its summary)."""
    finish_reason: str = "stop"
    """"length" when the answer hit its token budget (incomplete), else "stop"."""


class _Filling:
    """``ResultBuilder``'s methods; its fields are ``EdgeResult``'s, made mutable."""

    def take(self, summary: t.Summary) -> None:
        """The cloud's answer: adopt its summary."""
        self.summary, self.answer, self.valid = summary, summary.answer, summary.answer_valid
        self.source = t.ResultSource.of(summary.source)
        self.fields, self.refine_mode = dict(summary.fields), summary.refine_mode
        self.finish_reason = summary.finish_reason or "stop"

    def freeze(self) -> EdgeResult:
        """The result, owning copies of what the run filled in."""
        return EdgeResult(**{f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(self)})


ResultBuilder = dataclasses.make_dataclass(
    "ResultBuilder",
    [
        (f.name, f.type, field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(EdgeResult)
    ],
    bases=(_Filling,),
    namespace={"__module__": __name__},
)
"""An ``EdgeResult`` being filled in by one run of a plan (drafts, verdicts and the summary arrive as
the run goes); ``freeze`` hands the result over. Derived from ``EdgeResult``'s fields, so the two
never drift apart (a frozen dataclass and a mutable one cannot share fields by inheritance)."""


Event = t.Draft | t.CloudEvent
OnEvent = Callable[[Event], None]


def _prepare_replay(why: str, result: ResultBuilder, answered: list[bool], emit: OnEvent) -> list[t.Draft]:
    """Ready ``result`` for a replay of its cloud session on another replica; returns the drafts written
    so far, which travel again as the replay's first round (no re-drafting)."""
    log.warning("cloud session failed before its summary (%s): replaying on another replica", why)
    result.replays.append(why)
    if answered:  # the streamed answer is withdrawn: the replay writes its own
        answered.clear()
        emit(t.AnswerReset(why))
    # Each index once: a replay after a kill once sent index 4 twice and lost the request to
    # INVALID_ARGUMENT (CI, test_replicas; the path that doubled it not found)
    drafts = list({d.index: d for d in result.drafts}.values())
    result.drafts, result.verdicts, result.summary = [], {}, None
    return drafts


class EdgePipeline:
    def __init__(self, engine: OrtDraftEngine | None, channel: grpc.aio.Channel | None, replays: int = 2) -> None:
        """``engine`` may be None for a cloud-only request (the edge model is still loading). A cloud
        session that fails before its summary is replayed up to ``replays`` times; the channel's
        balancer puts the replay on another serving replica."""
        self.engine = engine
        self.channel = channel
        self.stub = pb_grpc.CoinferCloudStub(channel) if channel is not None else None
        self.replays = replays

    async def _replica_ready(self, wait_s: float = 2.0) -> bool:
        """Whether the balanced channel has a serving replica to replay on: READY (some subchannel is
        connected and healthy) or TRANSIENT_FAILURE (none is: answer locally now, do not wait for the
        deadline), waiting up to ``wait_s`` while it settles after the failure."""
        end = time.monotonic() + wait_s
        while (left := end - time.monotonic()) > 0:
            state = self.channel.get_state(try_to_connect=True)
            if state == grpc.ChannelConnectivity.READY:
                return True
            if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                return False
            try:
                await asyncio.wait_for(self.channel.wait_for_state_change(state), left)
            except TimeoutError:
                break
        return False

    async def _draft_round(
        self,
        task_prompt: str,
        s: Sampling,
        start: int,
        t0: float,
        emit: Callable[[t.Draft], asyncio.Future | None],
        stop_at: float | None = None,
    ) -> list[t.Draft]:
        """Write ``s.n`` drafts in a worker thread; ``emit`` each one on the loop as it finishes. At
        ``stop_at`` (``time.perf_counter()``) the drafts still being written end there, truncated: the
        request's deadline bounds drafting (192 tokens took 3.4 s here against a 3 s deadline)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[DraftResult | None] = asyncio.Queue()
        stop = False

        def cancelled() -> bool:
            return stop or (stop_at is not None and time.perf_counter() >= stop_at)

        job = loop.run_in_executor(
            None,
            lambda: self.engine.generate(
                task_prompt, s, on_draft=lambda d: loop.call_soon_threadsafe(q.put_nowait, d), cancelled=cancelled
            ),
        )
        job.add_done_callback(lambda _: q.put_nowait(None))  # done callbacks run on the loop: after every draft
        out: list[t.Draft] = []
        try:
            while (r := await q.get()) is not None:
                d = t.Draft(
                    start + r.index,
                    r.text,
                    r.num_tokens,
                    r.mean_logprob,
                    (time.perf_counter() - t0) * 1e3,
                    truncated=r.finish_reason == "length",
                )
                out.append(d)
                res = emit(d)
                if res is not None:
                    await res
            await job  # re-raise a drafting error
        finally:
            stop = True
        return out

    @staticmethod
    def local_answer(rules: RuleSet, drafts: list[t.Draft]) -> tuple[t.Draft | None, bool, dict]:
        """Best draft by (passes the rules -- degenerate repetition included --, agreement on the
        extracted answer, finished before its token budget, mean logprob): (draft, valid, extracted
        fields). The best invalid one if none is valid. A truncated draft loses to a finished one
        of any score: its higher mean logprob is that of an answer that never reached its end."""
        if not drafts:
            return None, False, {}
        checked = [rules.check(d.text) for d in drafts]
        keys = [rules.task.answer_key(parsed) if res.valid else None for res, parsed in checked]
        agree = {k: keys.count(k) for k in keys if k is not None}
        best = max(
            range(len(drafts)),
            key=lambda i: (checked[i][0].valid, agree.get(keys[i], 0), not drafts[i].truncated, drafts[i].mean_logprob),
        )
        res, parsed = checked[best]
        return drafts[best], res.valid, dict(parsed.fields) if parsed.ok else {}

    async def _finish_local(self, result: ResultBuilder, ruleset: RuleSet) -> None:
        # the request's rules over every draft: off the loop
        best, result.valid, result.fields = await asyncio.to_thread(self.local_answer, ruleset, result.drafts)
        result.answer = best.text if best is not None else ""
        result.finish_reason = "length" if best is not None and best.truncated else "stop"

    async def solve(
        self,
        task_name: str,
        prompt: str,
        rules: list[Rule] | None = None,
        sampling: Sampling | None = None,
        plan: Plan = Plan.SPLIT,
        deadline_s: float = 60.0,
        request_id: str = "",
        on_event: OnEvent | None = None,
        *,
        messages: list[ChatMessage] | None = None,
        extraction: Extraction | None = None,
        refine: t.SamplingParams | None = None,
        drafts: list[t.Draft] | None = None,
        local_reserve_s: float = 0.0,
    ) -> EdgeResult:
        """Answer ``prompt`` (one user turn) or ``messages`` (a conversation) under ``plan``.

        ``task_name`` "" is an open request; ``extraction`` and ``rules`` say how answers are
        checked; ``refine`` is the cloud refinement's sampling (None: the cloud's defaults);
        ``drafts``: drafts already written for this request (an edge answer escalated to the
        cloud sends them as its first round instead of drafting again). ``local_reserve_s``: under
        the cloud plan, local drafts start this long before the deadline (a hedge, cancelled when
        the cloud answers), so that a cloud that misses it leaves an answer ready at the deadline
        rather than one drafted after it. The cloud is given a deadline ``CLOUD_MARGIN_S`` shorter
        than the edge's, so that its best answer by then arrives before the edge stops waiting."""
        t0 = time.perf_counter()
        task = get_task(task_name)
        cloud_deadline_ms = int(max(0.05, deadline_s - min(CLOUD_MARGIN_S, 0.1 * deadline_s)) * 1e3)
        req = t.OpenRequest(
            request_id=request_id,
            task=task_name,
            prompt="" if messages else prompt,
            rules=list(rules or []),
            refine=refine,
            deadline_ms=cloud_deadline_ms,
            messages=list(messages or []),
            extraction=extraction or Extraction(),
        )
        ruleset = await asyncio.to_thread(
            lambda: RuleSet(rules or [], task, task.parse_problem(req.question), extraction=req.extraction)
        )
        s = sampling or Sampling()
        s.validate()
        req.expected_drafts = len(drafts) if drafts else s.n
        emit = on_event or (lambda ev: None)
        result = ResultBuilder("", t.ResultSource.EDGE_ONLY, False, task=task_name)
        model_prompt = self.engine.render(req.conversation) if self.engine is not None else ""
        local_stop = t0 + deadline_s - LOCAL_FINISH_S  # local drafts end in time for the rules and the reply
        if plan is Plan.EDGE or self.stub is None:
            result.drafts = await self._draft_round(model_prompt, s, 0, t0, lambda d: emit(d), local_stop)
            await self._finish_local(result, ruleset)
            result.rounds = 1
            result.timings = {"drafting": (time.perf_counter() - t0) * 1e3, "total": (time.perf_counter() - t0) * 1e3}
            return result.freeze()
        hedge: asyncio.Task | None = None  # the cloud plan's local answer, started before the deadline
        hedging: list[bool] = []
        if plan is Plan.CLOUD and self.engine is not None and not drafts and local_reserve_s > 0:

            async def draft_early() -> list[t.Draft]:
                await asyncio.sleep(max(0.0, deadline_s - local_reserve_s))
                hedging.append(True)
                return await self._draft_round(model_prompt, s, 0, t0, lambda d: None, local_stop)

            hedge = asyncio.create_task(draft_early())
        try:
            done = await self._solve_remote(
                req,
                ruleset,
                model_prompt,
                s,
                plan,
                deadline_s,
                t0,
                emit,
                result,
                drafts,
                lambda: hedge if hedging else None,
            )
            return done.freeze()
        finally:
            if hedge is not None and not hedge.done():
                hedge.cancel()  # the cloud answered (or failed early): no local drafts from it
                await asyncio.gather(hedge, return_exceptions=True)

    async def _solve_remote(
        self,
        req: t.OpenRequest,
        ruleset: RuleSet,
        model_prompt: str,
        s: Sampling,
        plan: Plan,
        deadline_s: float,
        t0: float,
        emit: OnEvent,
        result: ResultBuilder,
        drafts: list[t.Draft] | None,
        hedge: Callable[[], asyncio.Task | None],
    ) -> ResultBuilder:
        """The split or cloud plan, with replays on other replicas and the local fallback (``hedge()``:
        the local drafts already under way, if any)."""
        answered: list[bool] = []

        def emit_cloud(ev: Event) -> None:
            if isinstance(ev, t.AnswerChunk) and ev.text:
                answered.append(True)
            elif isinstance(ev, t.AnswerReset):  # the cloud withdrew what it streamed (passed on as is)
                answered.clear()
            emit(ev)

        try:
            async with asyncio.timeout(deadline_s):
                while True:
                    left = max(0.1, deadline_s - (time.perf_counter() - t0))
                    # no wait_for_ready on a replay: _replica_ready saw a READY replica; if it is gone by
                    # now the call fails fast (and may replay again) instead of waiting out the deadline
                    try:
                        if plan is Plan.CLOUD:
                            return await self._cloud_only(req, left, emit_cloud, t0)
                        return await self._split(req, model_prompt, s, left, emit_cloud, t0, result, drafts or None)
                    except (grpc.aio.AioRpcError, ConnectionError) as exc:
                        if (
                            len(result.replays) >= self.replays
                            or not replayable(exc)
                            or not await self._replica_ready()
                        ):
                            raise
                        drafts = _prepare_replay(failure_reason(exc), result, answered, emit) or drafts
        except (grpc.aio.AioRpcError, TimeoutError, ConnectionError) as exc:
            reason = failure_reason(exc)
            if isinstance(exc, grpc.aio.AioRpcError) and request_fault(exc):
                # the request itself is wrong: falling back would hide it; the cloud's message names the field
                kind = InvalidArgument if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else ResourceExhausted
                raise kind(exc.details() or "request: refused by the cloud") from None
            if answered:  # what the cloud streamed is withdrawn: the answer now comes from the edge
                emit(t.AnswerReset(reason))
            if self.engine is None:
                raise CloudFailed(
                    reason, failure_kind(exc)
                ) from exc  # the caller loads the edge model, answers locally
            log.warning("cloud failed (%s): answering from local drafts", reason)
            if not result.drafts:  # drafts already written (escalated, or before a replay) are not written again
                early = hedge()
                # past the deadline already: a short round still (an answer, late by at most this)
                stop = max(t0 + deadline_s - LOCAL_FINISH_S, time.perf_counter() + LATE_DRAFT_S)
                result.drafts = (
                    list(drafts)
                    if drafts
                    else await early
                    if early is not None
                    else await self._draft_round(model_prompt, s, 0, t0, lambda d: None, stop)
                )
            await self._finish_local(result, ruleset)
            result.source, result.fallback_reason, result.summary = t.ResultSource.EDGE_ONLY, reason, None
            result.fallback_kind = failure_kind(exc)
            result.refine_mode = ""
            result.timings["total"] = (time.perf_counter() - t0) * 1e3
            return result

    async def _split(
        self,
        req: t.OpenRequest,
        task_prompt: str,
        s: Sampling,
        deadline_s: float,
        emit: OnEvent,
        t0: float,
        result: ResultBuilder,
        written: list[t.Draft] | None = None,
    ) -> ResultBuilder:
        call = self.stub.Session(timeout=deadline_s)
        await call.write(pb.EdgeMessage(open=convert.open_to_pb(req)))
        return await _SplitSession(self, call, req, task_prompt, emit, t0, result, written).run(s)

    async def _cloud_only(self, req: t.OpenRequest, deadline_s: float, emit: OnEvent, t0: float) -> ResultBuilder:
        msg = pb.GenerateRequest(
            request_id=req.request_id, problem=convert.problem_to_pb(req), deadline_ms=req.deadline_ms
        )
        if req.refine is not None:
            msg.sampling.CopyFrom(convert.to_pb(req.refine, pb.SamplingParams))
        result = ResultBuilder("", t.ResultSource.CLOUD, False, task=req.task)
        async for m in self.stub.Generate(msg, timeout=deadline_s):
            ev = convert.event_from_pb(m)
            emit(ev)
            if isinstance(ev, t.Summary):
                result.take(ev)
                result.source = t.ResultSource.CLOUD
        result.timings = {"total": (time.perf_counter() - t0) * 1e3}
        return result


class _SplitSession:
    """One cloud session of the split plan: drafts written as they are made (``written``: drafts that
    exist already, sent as the first round), verdicts and the summary read into ``result``."""

    def __init__(
        self,
        pipe: EdgePipeline,
        call,
        req: t.OpenRequest,
        task_prompt: str,
        emit: OnEvent,
        t0: float,
        result: ResultBuilder,
        written: list[t.Draft] | None,
    ) -> None:
        self.pipe, self.call, self.task_prompt, self.emit, self.t0 = pipe, call, task_prompt, emit, t0
        self.result, self.written, self.drafting_ms = result, written, 0.0
        # drafts are written once the cloud has accepted the session: a refusal at open (token, quota,
        # draining) then ends the stream before any write of ours, whose failure grpc.aio would report
        # as INTERNAL "Internal error from Core" in place of the server's status (grpc/grpc#36066).
        # Drafting itself starts at once; only the writes wait (one round trip, well under a draft).
        self.accepted = asyncio.Event()
        # drafts end in time for the cloud to verify them before its own deadline (it then answers
        # with the best verified draft): a draft still being written at the deadline helps no one
        cloud_s = req.deadline_ms / 1e3
        self.stop_at = t0 + cloud_s - min(SPLIT_VERIFY_RESERVE_S, 0.15 * cloud_s)

    async def write(self, msg: pb.EdgeMessage) -> None:
        await self.accepted.wait()
        await self.call.write(msg)

    def _send(self, d: t.Draft) -> asyncio.Future:
        self.result.drafts.append(d)
        self.emit(d)
        self.result.timings.setdefault("first_draft", d.edge_ms)
        return asyncio.ensure_future(self.write(pb.EdgeMessage(draft=convert.to_pb(d, pb.Draft))))

    async def round(self, sampling: Sampling, start: int) -> None:
        t_r = time.perf_counter()
        if self.written and start == 0:  # escalated or replayed: the drafts exist, send them as they are
            drafts = list(self.written)
            self.result.drafts.extend(drafts)
            for d in drafts:
                await self.write(pb.EdgeMessage(draft=convert.to_pb(d, pb.Draft)))
        else:
            drafts = await self.pipe._draft_round(self.task_prompt, sampling, start, self.t0, self._send, self.stop_at)
            # drafted rounds only: sending drafts that exist waits for the session's acceptance (a
            # round trip the planner's transfer term holds), which is no drafting
            self.drafting_ms += (time.perf_counter() - t_r) * 1e3
        await self.write(pb.EdgeMessage(done=pb.DraftsDone(count=len(drafts))))

    async def run(self, s: Sampling) -> ResultBuilder:
        result = self.result
        result.rounds = 1
        writer = asyncio.create_task(self.round(s, 0))
        try:
            async for msg in self.call:
                ev = convert.event_from_pb(msg)
                self.emit(ev)
                if isinstance(ev, t.SessionAccepted):
                    self.accepted.set()
                elif isinstance(ev, t.Verdict):
                    result.verdicts[ev.draft_index] = ev
                elif isinstance(ev, t.RetryAdvice):
                    await writer
                    result.rounds += 1
                    # the next index past every draft written (not their count: a replay's list need not be dense)
                    start = max((d.index for d in result.drafts), default=-1) + 1
                    writer = asyncio.create_task(self.round(follow_advice(s, ev), start))
                elif isinstance(ev, t.Summary):
                    result.take(ev)
            await writer
            await self.call.done_writing()
        finally:
            if not writer.done():
                writer.cancel()
            elif not writer.cancelled():
                writer.exception()  # a write that failed with the stream: retrieved, the read side reports it
        if result.summary is None:
            raise ConnectionError("session ended without a summary")
        result.timings.update(drafting=self.drafting_ms, total=(time.perf_counter() - self.t0) * 1e3)
        return result
