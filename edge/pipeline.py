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
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import grpc

from coinfer import convert
from coinfer import types as t
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import get_task
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc
from edge.draft_engine import DraftResult, OrtDraftEngine
from edge.sampling import Sampling

log = logging.getLogger(__name__)


class CloudFailed(ConnectionError):
    """The cloud failed a request and no edge model is loaded to answer it locally."""


class Plan(StrEnum):
    EDGE = "edge"
    SPLIT = "split"
    CLOUD = "cloud"


@dataclass
class EdgeResult:
    """What the application gets back."""

    answer: str
    source: str
    """refined | draft | cloud (cloud answered) or edge_only (local fallback / edge plan)."""
    valid: bool
    drafts: list[t.Draft] = field(default_factory=list)
    verdicts: dict[int, t.Verdict] = field(default_factory=dict)
    summary: t.Summary | None = None
    rounds: int = 0
    fallback_reason: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    """ms: first_draft, drafting (all rounds), total."""
    predicted: dict[str, float] = field(default_factory=dict)
    """The planner's predicted breakdown (ms) for the plan that ran."""
    plan_reason: str = ""


Event = t.Draft | t.CloudEvent
OnEvent = Callable[[Event], None]


class EdgePipeline:
    def __init__(self, engine: OrtDraftEngine | None, channel: grpc.aio.Channel | None) -> None:
        """``engine`` may be None for a cloud-only request (the edge model is still loading)."""
        self.engine = engine
        self.stub = pb_grpc.CoinferCloudStub(channel) if channel is not None else None

    async def _draft_round(self, task_prompt: str, s: Sampling, start: int, t0: float,
                           emit: Callable[[t.Draft], asyncio.Future | None]) -> list[t.Draft]:
        """Write ``s.n`` drafts in a worker thread; ``emit`` each one on the loop as it finishes."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[DraftResult | None] = asyncio.Queue()
        stop = False
        job = loop.run_in_executor(None, lambda: self.engine.generate(
            task_prompt, s, on_draft=lambda d: loop.call_soon_threadsafe(q.put_nowait, d), cancelled=lambda: stop))
        job.add_done_callback(lambda _: q.put_nowait(None))  # done callbacks run on the loop: after every draft
        out: list[t.Draft] = []
        try:
            while (r := await q.get()) is not None:
                d = t.Draft(start + r.index, r.text, r.num_tokens, r.mean_logprob, (time.perf_counter() - t0) * 1e3)
                out.append(d)
                res = emit(d)
                if res is not None:
                    await res
            await job  # re-raise a drafting error
        finally:
            stop = True
        return out

    def _local_answer(self, rules: RuleSet, drafts: list[t.Draft]) -> tuple[str, bool]:
        """Best rule-valid draft by mean logprob; the best invalid one if none is valid."""
        judged = [(rules.check(d.text)[0].valid, d.mean_logprob, d) for d in drafts]
        if not judged:
            return "", False
        valid, _, best = max(judged, key=lambda x: (x[0], x[1]))
        return best.text, valid

    async def solve(self, task_name: str, prompt: str, rules: list[Rule] | None = None, sampling: Sampling | None = None,
                    plan: Plan = Plan.SPLIT, deadline_s: float = 60.0, request_id: str = "",
                    on_event: OnEvent | None = None) -> EdgeResult:
        t0 = time.perf_counter()
        task = get_task(task_name)
        spec = task.parse_problem(prompt)
        ruleset = RuleSet(rules or [], task, spec)
        s = sampling or Sampling()
        s.validate()
        emit = on_event or (lambda ev: None)
        req = t.OpenRequest(request_id, task_name, prompt, list(rules or []), None, s.n, int(deadline_s * 1e3))
        result = EdgeResult("", "edge_only", False)
        if plan is Plan.EDGE or self.stub is None:
            drafts = await self._draft_round(task.format_prompt(prompt), s, 0, t0, lambda d: emit(d))
            result.drafts = drafts
            result.answer, result.valid = self._local_answer(ruleset, drafts)
            result.rounds = 1
            result.timings = {"drafting": (time.perf_counter() - t0) * 1e3, "total": (time.perf_counter() - t0) * 1e3}
            return result
        try:
            async with asyncio.timeout(deadline_s):
                if plan is Plan.CLOUD:
                    return await self._cloud_only(req, deadline_s, emit, t0)
                return await self._split(req, task.format_prompt(prompt), s, deadline_s, emit, t0, result)
        except (grpc.aio.AioRpcError, TimeoutError, ConnectionError) as exc:
            reason = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAUTHENTICATED):
                raise  # the request itself is wrong: falling back would hide it
            if self.engine is None:
                raise CloudFailed(reason) from exc  # the caller loads the edge model and answers locally
            log.warning("cloud failed (%s): answering from local drafts", reason)
            if not result.drafts:
                result.drafts = await self._draft_round(task.format_prompt(prompt), s, 0, t0, lambda d: None)
            result.answer, result.valid = self._local_answer(ruleset, result.drafts)
            result.source, result.fallback_reason, result.summary = "edge_only", reason, None
            result.timings["total"] = (time.perf_counter() - t0) * 1e3
            return result

    async def _split(self, req: t.OpenRequest, task_prompt: str, s: Sampling, deadline_s: float, emit: OnEvent,
                     t0: float, result: EdgeResult) -> EdgeResult:
        call = self.stub.Session(timeout=deadline_s)
        await call.write(pb.EdgeMessage(open=convert.open_to_pb(req)))
        drafting_ms = 0.0

        async def round_(sampling: Sampling, start: int) -> None:
            nonlocal drafting_ms
            t_r = time.perf_counter()

            def send(d: t.Draft) -> asyncio.Future:
                result.drafts.append(d)
                emit(d)
                result.timings.setdefault("first_draft", d.edge_ms)
                return call.write(pb.EdgeMessage(draft=convert.to_pb(d, pb.Draft)))

            drafts = await self._draft_round(task_prompt, sampling, start, t0, send)
            drafting_ms += (time.perf_counter() - t_r) * 1e3
            await call.write(pb.EdgeMessage(done=pb.DraftsDone(count=len(drafts))))

        result.rounds = 1
        writer = asyncio.create_task(round_(s, 0))
        try:
            async for msg in call:
                ev = convert.event_from_pb(msg)
                emit(ev)
                if isinstance(ev, t.Verdict):
                    result.verdicts[ev.draft_index] = ev
                elif isinstance(ev, t.RetryAdvice):
                    await writer
                    advised = dataclasses.replace(s, n=ev.num_drafts, **{
                        f.name: getattr(ev.sampling, f.name) for f in dataclasses.fields(t.SamplingParams)
                        if f.name != "seed"})
                    result.rounds += 1
                    writer = asyncio.create_task(round_(advised, len(result.drafts)))
                elif isinstance(ev, t.Summary):
                    result.summary = ev
                    result.answer, result.valid = ev.answer, ev.answer_valid
                    result.source = t.AnswerSource(ev.source).name.lower()
            await writer
            await call.done_writing()
        finally:
            if not writer.done():
                writer.cancel()
        if result.summary is None:
            raise ConnectionError("session ended without a summary")
        result.timings.update(drafting=drafting_ms, total=(time.perf_counter() - t0) * 1e3)
        return result

    async def _cloud_only(self, req: t.OpenRequest, deadline_s: float, emit: OnEvent, t0: float) -> EdgeResult:
        msg = pb.GenerateRequest(request_id=req.request_id, problem=convert.open_to_pb(req).problem,
                                 deadline_ms=req.deadline_ms)
        result = EdgeResult("", "cloud", False)
        async for m in self.stub.Generate(msg, timeout=deadline_s):
            ev = convert.event_from_pb(m)
            emit(ev)
            if isinstance(ev, t.Summary):
                result.summary, result.answer, result.valid = ev, ev.answer, ev.answer_valid
        result.timings = {"total": (time.perf_counter() - t0) * 1e3}
        return result
