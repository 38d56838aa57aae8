"""The split and cloud plans' side of a run: the cloud session (drafts written as they are made,
verdicts, retry advice, the summary), the cloud plan's stream, and replays of a failed session on
another replica. ``edge.pipeline.EdgePipeline.run`` starts one ``Remote`` per run."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

import grpc

from coinfer import convert
from coinfer import types as t
from coinfer.edge.failures import CloudFailed, failure_reason, replayable, request_fault
from coinfer.edge.request import ValidRequest
from coinfer.edge.result import ResultBuilder
from coinfer.edge.sampling import Sampling
from coinfer.errors import from_rpc
from coinfer.types import Plan
from coinfer.v1 import coinfer_pb2 as pb

if TYPE_CHECKING:
    from coinfer.edge.pipeline import EdgePipeline, LocalStandby, OnEvent, Run

log = logging.getLogger(__name__)

GREEDY_DRAFT_TOKENS = 32
"""The first round's greedy draft ends after this many tokens (``Draft.greedy``): the cloud checks it while the
round's other drafts are still being written, and asks for its continuation (``DraftFrom``) where it takes it.
About what a check takes of SmolLM2's INT8 greedy drafts for its float model (docs/measurements.md, "Exact
split": a 96-token draft was taken 33% on average, its rejected tail scored for nothing)."""
SPLIT_VERIFY_RESERVE_S = 0.5
"""Split drafting stops this long (at most 15% of it) before the cloud's deadline: its verification."""


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


def prepare_replay(why: str, result: ResultBuilder, run: Run) -> list[t.Draft]:
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


class Remote:
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
        standby: LocalStandby | None,
    ) -> None:
        self.pipe, self.request, self.req, self.run, self.model_prompt = pipe, request, req, run, model_prompt
        self.t0, self.standby = t0, standby

    async def solve(self, result: ResultBuilder) -> ResultBuilder:
        run, drafts = self.run, self.run.drafts
        try:
            async with asyncio.timeout(run.deadline_s):
                while True:
                    left = max(0.1, run.deadline_s - (time.perf_counter() - self.t0))
                    # no wait_for_ready on a replay: replica_ready saw a READY replica; if it is gone by
                    # now the call fails fast (and may replay again) instead of waiting out the deadline
                    try:
                        if run.plan is Plan.CLOUD:
                            return await self._cloud_only(left)
                        return await self._split(left, result, drafts or None)
                    except (grpc.aio.AioRpcError, ConnectionError) as exc:
                        if (
                            len(result.replays) >= self.pipe.replays
                            or not replayable(exc)
                            or not await self.pipe.replica_ready()
                        ):
                            raise
                        drafts = prepare_replay(failure_reason(exc), result, run) or drafts
        except (grpc.aio.AioRpcError, TimeoutError, ConnectionError) as exc:
            if isinstance(exc, grpc.aio.AioRpcError) and request_fault(exc):
                # the request itself is wrong: falling back would hide it; the cloud's ErrorInfo names the field
                raise from_rpc(exc) from None
            standby = self.standby.hand_over() if self.standby is not None else None
            raise CloudFailed(exc, partial=result, written=drafts, standby=standby, t0=self.t0) from exc

    async def _split(self, deadline_s: float, result: ResultBuilder, written: list[t.Draft] | None) -> ResultBuilder:
        call = self.pipe.stub.Session(timeout=deadline_s)
        await call.write(pb.EdgeMessage(open=convert.open_to_pb(self.req)))
        session = SplitSession(
            pipe=self.pipe,
            call=call,
            req=self.req,
            task_prompt=self.model_prompt,
            emit=self.run.emit,
            t0=self.t0,
            result=result,
            written=written,
        )
        return await session.run(self.request.sampling, greedy_first=self.request.greedy_first)

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
        if result.summary is None:  # a stream that ended early (status OK, no Summary) is no answer: replayed
            raise ConnectionError("session ended without a summary")
        result.timings = {"total": (time.perf_counter() - self.t0) * 1e3}
        return result


class SplitSession:
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
        self.closed = False
        """The edge half-closed its side (the Summary is in): nothing more is written."""
        self._half_closing: asyncio.Future | None = None
        """The half-close after a round whose drafting failed (``_writer``)."""
        self._writing: asyncio.Future | None = None
        """The write under way. Shielded from the writer's cancellation: a write cancelled half-way leaves
        its operation pending in gRPC's core, and the half-close after it fails as INTERNAL."""

    async def write(self, msg: pb.EdgeMessage) -> None:
        await self.accepted.wait()
        if self.closed:
            return
        self._writing = asyncio.ensure_future(self.call.write(msg))
        await asyncio.shield(self._writing)

    def _writer(self, coro) -> asyncio.Task:
        """A round's writer task. One whose drafting fails (not its write: the read side reports the stream's
        own failure) half-closes the call: the cloud answers from what it has, at once, rather than wait for
        the round's end until its deadline."""
        task = asyncio.create_task(coro)

        def done(tk: asyncio.Task) -> None:
            exc = None if tk.cancelled() else tk.exception()
            if exc is not None and not isinstance(exc, (grpc.aio.AioRpcError, grpc.aio.UsageError)):
                log.warning("drafting failed; the cloud answers from what it has: %r", exc)
                self._half_closing = asyncio.ensure_future(self._end_writes())

        task.add_done_callback(done)
        return task

    async def _end_writes(self) -> None:
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        if not self.closed:
            self.closed = True
            try:
                await self.call.done_writing()
            except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
                log.debug("half-close after a failed round: %s", exc)

    async def stop_writing(self, writer: asyncio.Task) -> None:
        """Stop a round still being drafted; a write under way finishes (a write cancelled half-way leaves its
        operation pending in gRPC's core)."""
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)

    async def half_close(self, writer: asyncio.Task) -> None:
        """The answer is in: stop drafting and writing, and half-close once the write under way is done, so
        that the cloud ends the call with no write of ours after it (``coinfer.cloud.edge_reader``)."""
        self.closed = True
        writer.cancel()  # a round still being drafted (the cloud answered before the round ended) stops there
        await asyncio.gather(writer, return_exceptions=True)
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        try:
            await self.call.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:  # the call ended first: nothing was lost
            log.debug("half-close after the summary: %s", exc)

    def _send(self, d: t.Draft) -> Awaitable[None] | None:
        """Draft ``d`` into the result and the events; its write, for the drafting round to await (in its own
        task: no task per draft)."""
        if self.closed:  # the Summary is in: a draft finished after it is no part of the session
            return None
        self.result.drafts.append(d)
        self.emit(d)
        self.result.timings.setdefault("first_draft", d.edge_ms)
        return self.write(pb.EdgeMessage(draft=convert.to_pb(d, pb.Draft)))

    async def round(self, sampling: Sampling, start: int, greedy: int = 0) -> None:
        """One round of drafts, each sent as it is written, then its end (``greedy``: the first so many written
        greedily, ``Draft.greedy``, and short: ``GREEDY_DRAFT_TOKENS``)."""
        t_r = time.perf_counter()
        if self.written and start == 0:  # escalated or replayed: the drafts exist, send them as they are
            drafts = list(self.written)
            self.result.drafts.extend(drafts)
            for d in drafts:
                await self.write(pb.EdgeMessage(draft=convert.to_pb(d, pb.Draft)))
        else:
            drafts = await self.pipe.draft_round(
                self.task_prompt,
                sampling,
                start=start,
                t0=self.t0,
                emit=self._send,
                stop_at=self.stop_at,
                greedy=greedy,
                greedy_tokens=GREEDY_DRAFT_TOKENS if greedy else 0,
            )
            # drafted rounds only: sending drafts that exist waits for the session's acceptance (a
            # round trip the planner's transfer term holds), which is no drafting
            self.drafting_ms += (time.perf_counter() - t_r) * 1e3
        await self.write(pb.EdgeMessage(done=pb.DraftsDone(count=len(drafts))))

    async def draft_from(self, ask: t.DraftFrom, sampling: Sampling) -> None:
        """The cloud's answer took the drafts as far as they were its own: drafts that continue its text
        ``ask.text`` (greedy, as the answer is), each sent as written, then the round's end."""
        t_r = time.perf_counter()
        s = dataclasses.replace(
            sampling,
            n=max(1, ask.num_drafts),
            temperature=0.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            max_new_tokens=min(sampling.max_new_tokens, ask.max_new_tokens or sampling.max_new_tokens),
        )
        drafts = await self.pipe.draft_round(
            self.task_prompt,
            s,
            start=self.next_index(),
            t0=self.t0,
            emit=self._send,
            stop_at=self.stop_at,
            prefix=ask.text,
            greedy=s.n,
            continues=ask.round,
        )
        self.drafting_ms += (time.perf_counter() - t_r) * 1e3
        await self.write(pb.EdgeMessage(done=pb.DraftsDone(count=len(drafts), continues=ask.round)))

    def next_index(self) -> int:
        """The next index past every draft written (not their count: a replay's list need not be dense)."""
        return max((d.index for d in self.result.drafts), default=-1) + 1

    async def run(self, s: Sampling, greedy_first: bool = False) -> ResultBuilder:
        """The session until its Summary (``greedy_first``: the first round's first draft is written greedily)."""
        result = self.result
        result.rounds = 1
        writer = self._writer(self.round(s, 0, greedy=int(greedy_first)))
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
                    writer = self._writer(self.round(follow_advice(s, ev), self.next_index()))
                elif isinstance(ev, t.DraftFrom):
                    # the cloud answers from here: what the round still drafts is read by no one
                    await self.stop_writing(writer)
                    writer = self._writer(self.draft_from(ev, s))
                elif isinstance(ev, t.Summary):
                    result.take(ev)
                    await self.half_close(writer)
            if result.summary is None:
                await writer
                if not self.closed:
                    await self.call.done_writing()
        except grpc.aio.AioRpcError as exc:
            if result.summary is None:
                raise
            # the Summary is the session's last message: a status lost after it (the call ended while a write
            # was under way, grpc/grpc#36066) loses nothing, and replaying the answered session would cost twice
            log.debug("cloud call ended after its summary: %s", failure_reason(exc))
        finally:
            if not writer.done():
                writer.cancel()
            elif not writer.cancelled():
                writer.exception()  # a write that failed with the stream: retrieved, the read side reports it
        if result.summary is None:
            raise ConnectionError("session ended without a summary")
        result.timings.update(drafting=self.drafting_ms, total=(time.perf_counter() - self.t0) * 1e3)
        return result
