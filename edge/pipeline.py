"""The edge's request pipeline: draft locally, stream drafts over a cloud session, follow retry
advice, replay a failed session on another replica; a cloud that still fails is reported as
``CloudFailed`` with what the run had (its partial result, the drafts already written, the hedge's
drafts under way), and the lifecycle (``edge/lifecycle.py``) decides the local answer.

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
from coinfer.edge.kinds import FallbackKind
from coinfer.edge.request import SolveRequest, ValidRequest, compiled
from coinfer.edge.sampling import Sampling
from coinfer.edge.shown import AnswerView
from coinfer.errors import Reason, error_info, from_rpc
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
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


def failure_kind(exc: BaseException) -> FallbackKind:
    """A cloud failure as data: the server's ``ErrorInfo`` reason (``coinfer.errors.Reason``); a deadline,
    the cloud's or the edge's own, is ``DEADLINE``; a stream that ended early is ``UNAVAILABLE``; any
    other call with no coinfer reason is ``TRANSPORT`` (its status name: ``failure_status``)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        reason = error_info(exc)[0]
        if reason:
            return FallbackKind.of_reason(reason)
        return FallbackKind.DEADLINE if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else FallbackKind.TRANSPORT
    return FallbackKind.DEADLINE if isinstance(exc, TimeoutError) else FallbackKind.UNAVAILABLE


def failure_status(exc: BaseException) -> str:
    """The gRPC status a cloud failure ended with, by name ("" when no call ended: the stream stopped
    early, or the edge's own wait ran out)."""
    return exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else ""


def cloud_failed(kind: FallbackKind | str) -> bool:
    """Whether a fallback (its ``failure_kind``) counts against the cloud in the circuit breaker
    (``FallbackKind.counts_against_cloud``)."""
    return FallbackKind(kind).counts_against_cloud


LOCAL_FINISH_S = 0.1
"""Local drafting stops this long before the request's deadline: the rules and the reply fit in it."""
SPLIT_VERIFY_RESERVE_S = 0.5
"""Split drafting stops this long (at most 15% of it) before the cloud's deadline: its verification."""
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
    """The cloud failed a run of the split or cloud plan (not the request's own fault: that is raised as
    the error it is), with what the run had when it did: every fallback is decided by the lifecycle
    (``edge/lifecycle.py``), which answers locally from it. Whoever catches it owns ``hedged``:
    ``release`` cancels drafts it did not use."""

    def __init__(
        self,
        exc: BaseException,
        *,
        partial: ResultBuilder | None = None,
        written: list[t.Draft] | None = None,
        hedged: asyncio.Task | None = None,
        t0: float = 0.0,
    ) -> None:
        super().__init__(failure_reason(exc))
        self.reason = failure_reason(exc)
        """The failure for people (``failure_reason``): the local answer's ``fallback_reason``."""
        self.kind = failure_kind(exc)
        """The failure as data (``failure_kind``)."""
        self.status = failure_status(exc)
        """The gRPC status it ended with (``failure_status``)."""
        self.partial = partial if partial is not None else ResultBuilder()
        """The run's result so far: its drafts (the last session's), verdicts, rounds, replays, timings."""
        self.written = list(written or [])
        """Drafts that existed before the last session (an escalation's, or those written before a
        replay), each index once."""
        self.hedged = hedged
        """The cloud plan's local drafts under way (the hedge had started), else None."""
        self.t0 = t0
        """The run's clock (``time.perf_counter()`` at its start): its deadline counts from it."""

    async def release(self) -> None:
        """Cancel the hedge's drafts if they are still being written (unused: no engine time for them)."""
        if self.hedged is not None and not self.hedged.done():
            self.hedged.cancel()
            await asyncio.gather(self.hedged, return_exceptions=True)


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
    fallback_kind: FallbackKind | None = None
    """The fallback's cause as data (``failure_kind``, or ``NO_CLOUD`` / ``CIRCUIT_OPEN`` when the
    cloud was skipped): what the breaker and the metrics decide on; ``fallback_reason`` is for people."""
    fallback_status: str = ""
    """The gRPC status name the failed cloud call ended with ("" when none did)."""
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
    refine_mode: t.RefineMode | None = None
    """How the cloud's refinement used the drafts; None: no refinement (the wire's "")."""
    replays: list[str] = field(default_factory=list)
    """Why each replay on another replica happened (a session that failed before its summary)."""
    finish_reason: t.FinishReason = t.FinishReason.STOP
    """``length`` when the answer hit its token budget (incomplete), ``repetition`` when the loop
    watch cut it, else ``stop``."""
    continued: dict[int, int] = field(default_factory=dict)
    """Drafts that continue streamed final text (a local answer after it): draft index -> that text's
    length. Such a draft's ``text`` begins with it; its ``num_tokens`` counts only what the edge wrote."""

    def written_drafts(self) -> list[t.Draft]:
        """The drafts as the edge wrote them: a continuation without the text it continued, so that each
        draft's text and ``num_tokens`` agree (what the planner learns bytes per token and lengths from)."""
        cut = self.continued
        return [dataclasses.replace(d, text=d.text[cut[d.index] :]) if d.index in cut else d for d in self.drafts]


@dataclass(kw_only=True)
class ResultBuilder:
    """An ``EdgeResult`` being filled in by one run of a plan (drafts, verdicts and the summary arrive as
    the run goes); ``freeze`` hands the result over. The same fields as ``EdgeResult``, mutable
    (tests/edge/test_pipeline.py holds the two field lists equal)."""

    answer: str = ""
    source: t.ResultSource = t.ResultSource.EDGE_ONLY
    valid: bool = False
    drafts: list[t.Draft] = field(default_factory=list)
    verdicts: dict[int, t.Verdict] = field(default_factory=dict)
    summary: t.Summary | None = None
    rounds: int = 0
    fallback_reason: str = ""
    fallback_kind: FallbackKind | None = None
    fallback_status: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    plan_reason: str = ""
    task: str = ""
    fields: dict = field(default_factory=dict)
    refine_mode: t.RefineMode | None = None
    replays: list[str] = field(default_factory=list)
    finish_reason: t.FinishReason = t.FinishReason.STOP
    continued: dict[int, int] = field(default_factory=dict)

    def take(self, summary: t.Summary) -> None:
        """The cloud's answer: adopt its summary."""
        self.summary, self.answer, self.valid = summary, summary.answer, summary.answer_valid
        self.source = t.ResultSource.of(summary.source)
        # typed by the converter off the wire; a Summary built in-process may still hold strings
        self.fields = dict(summary.fields)
        self.refine_mode = convert.str_enum(t.RefineMode, summary.refine_mode, None, "refine_mode")
        self.finish_reason = convert.str_enum(
            t.FinishReason, summary.finish_reason, t.FinishReason.STOP, "finish_reason"
        )

    def fell_back(self, failed: CloudFailed) -> None:
        """The cloud failed: the answer is the edge's, and says why."""
        self.source, self.summary, self.refine_mode = t.ResultSource.EDGE_ONLY, None, None
        self.fallback_reason, self.fallback_kind, self.fallback_status = failed.reason, failed.kind, failed.status

    def continue_with(self, drafts: list[t.Draft], prefix: str) -> None:
        """``drafts`` continue ``prefix`` (streamed final text): noted in ``continued``."""
        if prefix:
            self.continued.update({d.index: len(prefix) for d in drafts})

    def freeze(self) -> EdgeResult:
        """The result, owning copies of what the run filled in."""
        return EdgeResult(**{f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(EdgeResult)})


Event = t.Draft | t.CloudEvent | t.AnswerReset
OnEvent = Callable[[Event], None]


def _ignore(ev: Event) -> None:
    pass


@dataclass(kw_only=True)
class Run:
    """How one run of a plan goes: its plan and deadline, where its events go, what the user has seen of
    the answer (``shown``: the pipeline feeds it every event it emits; a fallback reads it), drafts
    already written for the request (an escalation sends them instead of drafting again) and, under
    the cloud plan, how long before the deadline the local answer starts (``local_reserve_s``)."""

    plan: Plan = Plan.SPLIT
    deadline_s: float = 60.0
    on_event: OnEvent = _ignore
    shown: AnswerView = field(default_factory=AnswerView)
    drafts: list[t.Draft] | None = None
    local_reserve_s: float = 0.0

    def emit(self, ev: Event) -> None:
        self.shown.see(ev)
        self.on_event(ev)


def _prepare_replay(why: str, result: ResultBuilder, run: Run) -> list[t.Draft]:
    """Ready ``result`` for a replay of its cloud session on another replica; returns the drafts written
    so far, which travel again as the replay's first round (no re-drafting)."""
    log.warning("cloud session failed before its summary (%s): replaying on another replica", why)
    result.replays.append(why)
    if run.shown.streamed:  # the streamed answer is withdrawn: the replay writes its own
        run.emit(t.AnswerReset(why))
    # Each index once: a replay after a kill once sent index 4 twice and lost the request to
    # INVALID_ARGUMENT (CI, test_replicas; the path that doubled it not found)
    drafts = list({d.index: d for d in result.drafts}.values())
    result.drafts, result.verdicts, result.summary = [], {}, None
    return drafts


class _Hedge:
    """The cloud plan's local answer, drafted from ``reserve_s`` before the deadline on (the cloud that
    answers in time cancels it; one that does not leaves an answer ready at the deadline)."""

    def __init__(self, draft: Callable[[], asyncio.Future], start_in_s: float) -> None:
        self.started = self.handed = False
        self._draft, self._start_in_s = draft, start_in_s
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> list[t.Draft]:
        await asyncio.sleep(self._start_in_s)
        self.started = True
        return await self._draft()

    def hand_over(self) -> asyncio.Task | None:
        """The drafts under way, if they started, for the fallback to use or cancel (``CloudFailed.hedged``);
        a hedge that has not started is cancelled by ``cancel`` now."""
        self.handed = self.started
        return self.task if self.started else None

    async def cancel(self) -> None:
        if not self.task.done() and not self.handed:
            self.task.cancel()  # the cloud answered (or failed early): no local drafts from it
            await asyncio.gather(self.task, return_exceptions=True)


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
        *,
        start: int,
        t0: float,
        emit: Callable[[t.Draft], asyncio.Future | None],
        stop_at: float | None = None,
        prefix: str = "",
    ) -> list[t.Draft]:
        """Write ``s.n`` drafts in a worker thread; ``emit`` each one on the loop as it finishes. At
        ``stop_at`` (``time.perf_counter()``) the drafts still being written end there, truncated: the
        request's deadline bounds drafting (192 tokens took 3.4 s here against a 3 s deadline).
        ``prefix``: answer text the drafts continue (each draft's text begins with it)."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[DraftResult | None] = asyncio.Queue()
        stop = False

        def cancelled() -> bool:
            return stop or (stop_at is not None and time.perf_counter() >= stop_at)

        job = loop.run_in_executor(
            None,
            lambda: self.engine.generate(
                task_prompt + prefix,
                s,
                on_draft=lambda d: loop.call_soon_threadsafe(q.put_nowait, d),
                cancelled=cancelled,
            ),
        )
        job.add_done_callback(lambda _: q.put_nowait(None))  # done callbacks run on the loop: after every draft
        out: list[t.Draft] = []
        try:
            while (r := await q.get()) is not None:
                d = t.Draft(
                    index=start + r.index,
                    text=prefix + r.text,
                    num_tokens=r.num_tokens,
                    mean_logprob=r.mean_logprob,
                    edge_ms=(time.perf_counter() - t0) * 1e3,
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

    async def finish_local(self, result: ResultBuilder, ruleset: RuleSet, drafts: list[t.Draft]) -> None:
        """The best of ``drafts`` as the answer (the request's rules over every one: off the loop)."""
        best, result.valid, result.fields = await asyncio.to_thread(self.local_answer, ruleset, drafts)
        result.answer = best.text if best is not None else ""
        result.finish_reason = t.FinishReason.LENGTH if best is not None and best.truncated else t.FinishReason.STOP

    async def local_round(
        self, request: ValidRequest, *, start: int, t0: float, stop_at: float, prefix: str = ""
    ) -> list[t.Draft]:
        """One round of the request's drafts, not emitted (a fallback's: the local answer is sent whole),
        indexed from ``start``, continuing ``prefix``, ending by ``stop_at``."""
        prompt = self.engine.render(request.conversation)
        return await self._draft_round(
            prompt, request.sampling, start=start, t0=t0, emit=_ignore, stop_at=stop_at, prefix=prefix
        )

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
        """Answer ``prompt`` (one user turn) or ``messages`` (a conversation) under ``plan``: the
        pipeline alone, without the daemon's checks (tools, benchmarks and tests); the daemon's
        lifecycle calls ``run`` with a request it checked and compiled once. A cloud that fails is
        answered locally by the lifecycle's own fallback (``lifecycle.answer_locally``; without an
        engine, ``CloudFailed`` is raised).

        ``task_name`` "" is an open request; ``extraction`` and ``rules`` say how answers are
        checked; ``refine`` is the cloud refinement's sampling (None: the cloud's defaults);
        ``drafts`` and ``local_reserve_s``: as ``Run``'s."""
        s = sampling or Sampling()
        s.validate()
        req = SolveRequest(
            prompt="" if messages else prompt,
            task=task_name,
            rules=list(rules or []),
            request_id=request_id,
            messages=list(messages or []),
            extraction=extraction or Extraction(),
        )
        valid = await asyncio.to_thread(compiled, req, s, deadline_s, refine=refine)
        run = Run(
            plan=plan,
            deadline_s=deadline_s,
            on_event=on_event or _ignore,
            drafts=drafts,
            local_reserve_s=local_reserve_s,
        )
        try:
            return await self.run(valid, run)
        except CloudFailed as failed:
            # imported here: the lifecycle, which decides every fallback, is built on this module
            from coinfer.edge.lifecycle import answer_locally

            return await answer_locally(self, valid, run, failed)

    async def run(self, request: ValidRequest, run: Run) -> EdgeResult:
        """One run of ``run.plan`` for a checked, compiled request. The cloud is given a deadline
        ``CLOUD_MARGIN_S`` shorter than the edge's, so that its best answer by then arrives before the
        edge stops waiting. A cloud that fails (its replays spent) raises ``CloudFailed``: the caller
        decides the local answer (``lifecycle.answer_locally``). The edge plan after streamed final text
        (``run.shown.final``) continues that text: an answer the user has begun to read is never
        replaced."""
        t0 = time.perf_counter()
        deadline_s, s = run.deadline_s, request.sampling
        cloud_deadline_ms = int(max(0.05, deadline_s - min(CLOUD_MARGIN_S, 0.1 * deadline_s)) * 1e3)
        req = request.open_request(cloud_deadline_ms, len(run.drafts) if run.drafts else s.n)
        result = ResultBuilder(task=request.req.task)
        model_prompt = self.engine.render(request.conversation) if self.engine is not None else ""
        local_stop = t0 + deadline_s - LOCAL_FINISH_S  # local drafts end in time for the rules and the reply
        if run.plan is Plan.EDGE or self.stub is None:
            result.drafts = await self._draft_round(
                model_prompt, s, start=0, t0=t0, emit=run.emit, stop_at=local_stop, prefix=run.shown.final
            )
            result.continue_with(result.drafts, run.shown.final)
            await self.finish_local(result, request.ruleset, result.drafts)
            result.rounds = 1
            result.timings = {"drafting": (time.perf_counter() - t0) * 1e3, "total": (time.perf_counter() - t0) * 1e3}
            return result.freeze()
        hedge = None
        if run.plan is Plan.CLOUD and self.engine is not None and not run.drafts and run.local_reserve_s > 0:
            hedge = _Hedge(
                lambda: self._draft_round(model_prompt, s, start=0, t0=t0, emit=_ignore, stop_at=local_stop),
                max(0.0, deadline_s - run.local_reserve_s),
            )
        try:
            remote = _Remote(
                pipe=self, request=request, req=req, run=run, model_prompt=model_prompt, t0=t0, hedge=hedge
            )
            return (await remote.solve(result)).freeze()
        finally:
            if hedge is not None:
                await hedge.cancel()  # unless CloudFailed carries its drafts: the fallback's to use or cancel


class _Remote:
    """The split or cloud plan of one run: its cloud session and replays on other replicas. A request's
    own fault is raised as its error; any other failure as ``CloudFailed`` with what the run had (the
    lifecycle answers locally from it)."""

    def __init__(
        self,
        *,
        pipe: EdgePipeline,
        request: ValidRequest,
        req: t.OpenRequest,
        run: Run,
        model_prompt: str,
        t0: float,
        hedge: _Hedge | None,
    ) -> None:
        self.pipe, self.request, self.req, self.run, self.model_prompt = pipe, request, req, run, model_prompt
        self.t0, self.hedge = t0, hedge

    async def solve(self, result: ResultBuilder) -> ResultBuilder:
        run, drafts = self.run, self.run.drafts
        try:
            async with asyncio.timeout(run.deadline_s):
                while True:
                    left = max(0.1, run.deadline_s - (time.perf_counter() - self.t0))
                    # no wait_for_ready on a replay: _replica_ready saw a READY replica; if it is gone by
                    # now the call fails fast (and may replay again) instead of waiting out the deadline
                    try:
                        if run.plan is Plan.CLOUD:
                            return await self._cloud_only(left)
                        return await self._split(left, result, drafts or None)
                    except (grpc.aio.AioRpcError, ConnectionError) as exc:
                        if (
                            len(result.replays) >= self.pipe.replays
                            or not replayable(exc)
                            or not await self.pipe._replica_ready()
                        ):
                            raise
                        drafts = _prepare_replay(failure_reason(exc), result, run) or drafts
        except (grpc.aio.AioRpcError, TimeoutError, ConnectionError) as exc:
            if isinstance(exc, grpc.aio.AioRpcError) and request_fault(exc):
                # the request itself is wrong: falling back would hide it; the cloud's ErrorInfo names the field
                raise from_rpc(exc) from None
            hedged = self.hedge.hand_over() if self.hedge is not None else None
            raise CloudFailed(exc, partial=result, written=drafts, hedged=hedged, t0=self.t0) from exc

    async def _split(self, deadline_s: float, result: ResultBuilder, written: list[t.Draft] | None) -> ResultBuilder:
        call = self.pipe.stub.Session(timeout=deadline_s)
        await call.write(pb.EdgeMessage(open=convert.open_to_pb(self.req)))
        session = _SplitSession(
            pipe=self.pipe,
            call=call,
            req=self.req,
            task_prompt=self.model_prompt,
            emit=self.run.emit,
            t0=self.t0,
            result=result,
            written=written,
        )
        return await session.run(self.request.sampling)

    async def _cloud_only(self, deadline_s: float) -> ResultBuilder:
        req = self.req
        msg = pb.GenerateRequest(
            request_id=req.request_id, problem=convert.problem_to_pb(req), deadline_ms=req.deadline_ms
        )
        if req.refine is not None:
            msg.sampling.CopyFrom(convert.to_pb(req.refine, pb.SamplingParams))
        result = ResultBuilder(source=t.ResultSource.CLOUD, task=req.task)
        async for m in self.pipe.stub.Generate(msg, timeout=deadline_s):
            ev = convert.event_from_pb(m)
            self.run.emit(ev)
            if isinstance(ev, t.Summary):
                result.take(ev)
                result.source = t.ResultSource.CLOUD
        result.timings = {"total": (time.perf_counter() - self.t0) * 1e3}
        return result


class _SplitSession:
    """One cloud session of the split plan: drafts written as they are made (``written``: drafts that
    exist already, sent as the first round), verdicts and the summary read into ``result``."""

    def __init__(
        self,
        *,
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
            drafts = await self.pipe._draft_round(
                self.task_prompt, sampling, start=start, t0=self.t0, emit=self._send, stop_at=self.stop_at
            )
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
            if result.summary is not None:
                # the answer is in. A round still being drafted (the cloud's own answer won the race,
                # coinfer.cloud.hedge) stops there; a draft write the ended call refused lost nothing
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
            else:
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
