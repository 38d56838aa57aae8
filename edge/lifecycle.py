"""One edge request's lifecycle, owned by one object, from a checked request to its last event: the plan
(the planner's choice under auto, the breaker's word on the cloud), every fallback (the cloud skipped:
none configured or its circuit open, ``RequestLifecycle.decide``; the cloud failing mid-run, its
replays on other replicas spent, ``RequestLifecycle._fall_back``: streamed text withdrawn, then a warm
edge answers from the drafts the run had, ``answer_locally``, and a cold one loads its model and
answers with the edge plan), auto's escalation of a rule-failing edge answer to a split with the same
drafts, the breaker and the planner fed with the outcome, and the request's events (one queue:
pipeline callbacks in, one generator out). ``EdgeCore`` checks the request and hands it over."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from coinfer import types as t
from coinfer.chat import conversation
from coinfer.edge.config import EdgeConfig
from coinfer.edge.draft_engine import OrtDraftEngine
from coinfer.edge.failures import CloudFailed
from coinfer.edge.kinds import FallbackKind, RequestedPlan
from coinfer.edge.link import CloudLink
from coinfer.edge.metrics import EdgeMetrics
from coinfer.edge.pipeline import LOCAL_FINISH_S, EdgePipeline, Event, Plan, Run
from coinfer.edge.planner.cost import Choice
from coinfer.edge.planner.planner import EdgeState, Planner
from coinfer.edge.request import ValidRequest
from coinfer.edge.result import EdgeResult
from coinfer.edge.shown import AnswerView

log = logging.getLogger(__name__)

LOCAL_RESERVE_FACTOR = 1.5
LOCAL_RESERVE_MIN_S = 0.25
"""A cloud plan's local fallback starts 1.5x its predicted drafting time + 0.25 s before the deadline
(the prediction is a mean; the margin covers the rules and the answer's trip to the client)."""
LATE_DRAFT_S = 0.5
"""A local answer that starts after the deadline still drafts this long (an answer rather than none)."""


def withdraw(run: Run, reason: str) -> None:
    """Before a local answer: what the cloud streamed since the last reset is withdrawn (an
    ``AnswerReset``); text that left final stays, and the local answer continues it."""
    if run.shown.streamed:
        run.emit(t.AnswerReset(reason))


async def answer_locally(pipe: EdgePipeline, request: ValidRequest, run: Run, failed: CloudFailed) -> EdgeResult:
    """The warm edge's answer to a cloud that failed mid-run (``failed``: what the run had), after the
    withdrawal: the best of the drafts written already (escalated, or before a replay), else of the
    standby's when they had started, else of a short round (past the deadline already: an answer, late
    by at most ``LATE_DRAFT_S``). After streamed final text, only drafts that begin with it; when none
    does, a round that continues it. The standby's drafts unused are cancelled. A pipeline with no
    engine raises ``failed`` again after the withdrawal (the daemon's lifecycle loads one first)."""
    try:
        withdraw(run, failed.reason)
        if pipe.engine is None:
            raise failed
        log.warning("cloud failed (%s): answering from local drafts", failed.reason)
        result, prefix = failed.partial, run.shown.final
        if not result.drafts:
            standby = failed.standby if not prefix and not failed.written else None
            result.drafts = list(failed.written) if failed.written else await standby if standby is not None else []
        usable = [d for d in result.drafts if d.text.startswith(prefix)]
        if not usable:
            await failed.release()  # the engine drafts the continuation alone
            stop = max(failed.t0 + run.deadline_s - LOCAL_FINISH_S, time.perf_counter() + LATE_DRAFT_S)
            start = max((d.index for d in result.drafts), default=-1) + 1
            usable = await pipe.local_round(request, start=start, t0=failed.t0, stop_at=stop, prefix=prefix)
            result.drafts = result.drafts + usable
            result.continue_with(usable, prefix)
        result.fell_back(failed)
        await pipe.finish_local(result, request.ruleset, usable, prefix)
        result.timings["total"] = (time.perf_counter() - failed.t0) * 1e3
        return result.freeze()
    finally:
        await failed.release()


async def _stop(job: asyncio.Task) -> None:
    """Cancel a request's run whose events nobody reads any more, and wait for it to end: its cloud call is
    cancelled before its events' close returns, not when the loop next runs the task. An error it ended
    on instead is logged (nobody else will read it)."""
    job.cancel()
    await asyncio.wait([job])
    if not job.cancelled() and job.exception() is not None:
        log.warning("a request's run failed after its events were closed", exc_info=job.exception())


class Edge(Protocol):
    """What a lifecycle uses of the daemon (``EdgeCore``): its parts, and its model's state."""

    cfg: EdgeConfig
    link: CloudLink
    planner: Planner
    metrics: EdgeMetrics

    def edge_state(self) -> EdgeState: ...

    def in_flight(self) -> AbstractContextManager[None]: ...

    def pool_queue(self) -> None: ...

    def maybe_reprobe(self) -> None: ...

    def engine_for(self, plan: Plan) -> Awaitable[OrtDraftEngine | None]: ...

    def load_engine(self) -> Awaitable[OrtDraftEngine]: ...


@dataclass(frozen=True)
class CloudTokens:
    """The cloud's target-model tokens for one request, as its Summary counts them (the rendered
    conversation's tokens, and every token generated: refinement and fallback candidates), summed
    over the request's cloud sessions that reached a summary (an escalation's split; a replayed
    session that failed before its summary reported none). 0 when the cloud was not used."""

    generated: int = 0
    prompt: int = 0

    @classmethod
    def of(cls, results: list[EdgeResult]) -> CloudTokens:
        summaries = [r.summary for r in results if r.summary is not None]
        return cls(
            generated=sum(x.timings.decode_tokens for x in summaries), prompt=sum(x.prompt_tokens for x in summaries)
        )


def cloud_cost(results: list[EdgeResult]) -> t.CloudCost:
    """The engine work the cloud reported for these runs (``Summary.cost``), summed."""
    total = t.CloudCost()
    for r in results:
        if r.summary is not None and r.summary.cost is not None:
            for f in dataclasses.fields(total):
                setattr(total, f.name, getattr(total, f.name) + getattr(r.summary.cost, f.name))
    return total


@dataclass(kw_only=True)
class Done:
    """The last event of a request."""

    result: EdgeResult
    plan: Plan
    """The plan that produced the answer: the last of ``plans`` ("split" after an escalation)."""
    plans: list[Plan] = field(default_factory=list)
    """The plans that ran, in order: the planner's choice first (["edge", "split"]: auto's edge
    answer failed the rules and a split refined its drafts)."""
    cloud_tokens: CloudTokens = field(default_factory=CloudTokens)
    cloud_cost: t.CloudCost = field(default_factory=t.CloudCost)
    """The engine work the cloud reported (``Summary.cost``), summed over the request's sessions that reached one."""

    def info(self) -> dict:
        """What both APIs report about a finished request besides its answer (gRPC SolveResult
        field names; enums as their wire strings)."""
        r = self.result
        return {
            "source": r.source,
            "valid": r.valid,
            "plan": self.plan,
            "plans": list(self.plans or [self.plan]),
            "rounds": r.rounds,
            "fallback_reason": r.fallback_reason,
            "timings_ms": r.timings,
            "predicted_ms": r.predicted,
            "plan_reason": r.plan_reason,
            "fields": r.fields,
            "refine_mode": r.refine_mode or "",
            "task": r.task,
            "replays": list(r.replays),
            "replica": r.summary.replica if r.summary is not None else "",
            "cloud_tokens": dataclasses.asdict(self.cloud_tokens),
            "finish_reason": r.finish_reason,
            "cloud_cost": dataclasses.asdict(self.cloud_cost),
        }


@dataclass
class Ran:
    """One plan that ran for a request: auto's edge plan, then its escalation to a split when the
    edge's answer failed the rules; otherwise just the plan chosen."""

    plan: Plan
    result: EdgeResult
    """Its own result and stage times (what the planner learns from)."""
    ms: float
    """Measured wall time: from the request's start for the first plan (waiting for a cold model
    counts, as in its prediction), from its own start for an escalation."""


def merged(runs: list[Ran]) -> EdgeResult:
    """The request's result: the last plan's answer, with the stage times of every plan that ran
    (``escalation``: the split's own time after the edge attempt)."""
    final = runs[-1].result
    if len(runs) > 1:
        first = runs[0].result.timings
        own = final.timings
        final = dataclasses.replace(
            final,
            timings=own
            | {
                "drafting": first.get("drafting", 0.0) + own.get("drafting", 0.0),
                "total": first.get("total", 0.0) + own.get("total", 0.0),
                "escalation": own.get("total", 0.0),
            },
        )
    return final


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The plan a request runs and why."""

    plan: Plan
    why: str
    """The planner's reason, or "requested"."""
    skipped: FallbackKind | None = None
    """Why the cloud the plan wanted is skipped (NO_CLOUD, CIRCUIT_OPEN): the edge answers."""
    skip_reason: str = ""
    edge: EdgeState
    """The edge's state when the plan was chosen (what the planner learns against)."""
    choice: Choice | None = None
    """The planner's choice (auto only: the predictions, and leave to escalate)."""


class RequestLifecycle:
    """Runs one checked request to its ``Done``: ``events()`` yields its events as they happen."""

    def __init__(self, edge: Edge, request: ValidRequest) -> None:
        self.edge, self.request = edge, request
        self.shown = AnswerView()
        """What the user has seen of the answer, the request's one record of it: the pipeline feeds it every event
        it emits, fallbacks read it, and the HTTP stream sends its final text from it (``edge/http.py``)."""
        self.t0 = time.perf_counter()
        """The user's clock: waiting for a cold model counts."""
        req = request.req
        self.task = req.task or "open"
        self.size = edge.planner.prompt_size("\n".join(m.content for m in conversation(req.prompt, req.messages)))
        self.runs: list[Ran] = []

    # ---- the plan ----------------------------------------------------------------------------------
    def decide(self) -> Decision:
        """The plan to run: the one asked for, or the planner's under auto; the edge when the cloud is
        skipped. An open circuit past its cool-down is offered to the planner too: the half-open trial
        is the only way back to the cloud (taken by ``allow()`` only if the plan chosen uses it)."""
        edge, link = self.edge, self.edge.link
        state = edge.edge_state()
        edge.pool_queue()
        asked, choice = self.request.plan, None
        if asked is RequestedPlan.AUTO:
            cloud_ok = link.enabled and link.breaker.would_allow()
            choice = edge.planner.choose(
                task=self.task, size=self.size, n=self.request.sampling.n, edge=state, cloud_available=cloud_ok
            )
            plan, why = choice.plan, choice.reason
        else:
            plan, why = asked.plan, "requested"
        if plan is not Plan.EDGE and not link.enabled:
            return Decision(
                plan=Plan.EDGE,
                why=why,
                skipped=FallbackKind.NO_CLOUD,
                skip_reason="no cloud configured",
                edge=state,
                choice=choice,
            )
        if plan is not Plan.EDGE and not link.breaker.allow():
            return Decision(
                plan=Plan.EDGE,
                why=why,
                skipped=FallbackKind.CIRCUIT_OPEN,
                skip_reason=f"cloud circuit {link.breaker.state}",
                edge=state,
                choice=choice,
            )
        return Decision(plan=plan, why=why, edge=state, choice=choice)

    def _local_reserve_s(self, d: Decision) -> float:
        """How long before the deadline a cloud plan's local answer starts (0: no standby)."""
        if d.plan is not Plan.CLOUD:
            return 0.0
        predicted = self.edge.planner.local_ms(task=self.task, size=self.size, n=self.request.sampling.n, edge=d.edge)
        return LOCAL_RESERVE_FACTOR * predicted / 1e3 + LOCAL_RESERVE_MIN_S

    # ---- the run -----------------------------------------------------------------------------------
    async def events(self) -> AsyncIterator[Event | Done]:
        """t.Draft, t.Verdict, t.AnswerChunk, t.AnswerReset ... as they happen, then one Done. Each event is
        in ``shown`` before it is yielded (the pipeline's ``Run.emit``): a stream reads the final text there."""
        edge = self.edge
        with edge.in_flight():
            d = self.decide()
            edge.maybe_reprobe()
            engine = await edge.engine_for(d.plan)
            edge.metrics.plans.labels(d.plan.value).inc()
            waited_ms = (time.perf_counter() - self.t0) * 1e3
            q: asyncio.Queue[Event | None] = asyncio.Queue()

            def on_event(ev: Event) -> None:
                if isinstance(ev, t.Draft):
                    edge.metrics.drafts.inc()
                    edge.metrics.tokens.inc(ev.num_tokens)
                q.put_nowait(ev)

            job = asyncio.create_task(self._run(d, engine, on_event))
            job.add_done_callback(lambda _: q.put_nowait(None))
            try:
                while (ev := await q.get()) is not None:
                    if not isinstance(ev, t.Summary):
                        yield ev
                await job  # a request's own fault (or a bug) is raised here
                self._after_cloud()
                self._learn(d)
                result = self._result(d, waited_ms)
                if not self.shown.streamed and result.answer:  # a local answer arrives whole (none: no chunk)
                    whole = t.AnswerChunk(result.answer)
                    self.shown.see(whole)
                    yield whole
                yield self._done(result)
            finally:
                if not job.done():  # closed early (its client left): the run and its cloud call end now
                    await _stop(job)

    def _done(self, result: EdgeResult) -> Done:
        """The request's last event, its metrics counted."""
        self._count(result)
        return Done(
            result=result,
            plan=self.runs[-1].plan,
            plans=[r.plan for r in self.runs],
            cloud_tokens=CloudTokens.of([r.result for r in self.runs]),
            cloud_cost=cloud_cost([r.result for r in self.runs]),
        )

    def _run_spec(self, plan: Plan, deadline_s: float, on_event, **extra) -> Run:
        return Run(plan=plan, deadline_s=deadline_s, on_event=on_event, shown=self.shown, **extra)

    def _left(self) -> float:
        return max(0.1, self.request.deadline_s - (time.perf_counter() - self.t0))

    async def _run(self, d: Decision, engine: OrtDraftEngine | None, on_event) -> None:
        """The plan chosen; under auto, a rule-failing edge answer escalates to a split with its drafts."""
        edge, request, link = self.edge, self.request, self.edge.link
        replays = edge.cfg.replays
        pipe = EdgePipeline(engine, link.channel if d.plan is not Plan.EDGE else None, replays)
        spec = self._run_spec(
            d.plan, request.deadline_s, on_event, local_reserve_s=self._local_reserve_s(d) if engine else 0.0
        )
        r = await self._attempt(pipe, spec)
        self.runs.append(Ran(plan=d.plan, result=r, ms=(time.perf_counter() - self.t0) * 1e3))
        if (
            d.plan is Plan.EDGE
            and d.choice is not None
            and not r.valid
            and r.drafts
            and not r.fallback_reason
            and d.skipped is None
            and link.enabled
            and link.breaker.allow()
        ):
            # auto chose the edge, but its answer failed the rules: a healthy cloud verifies and
            # refines the same drafts (sent as they are: no drafting twice)
            t1 = time.perf_counter()
            up = EdgePipeline(engine, link.channel, replays)
            r2 = await self._attempt(up, self._run_spec(Plan.SPLIT, self._left(), on_event, drafts=r.drafts))
            r2 = dataclasses.replace(r2, plan_reason="edge answer failed the rules: escalated to split with its drafts")
            self.runs.append(Ran(plan=Plan.SPLIT, result=r2, ms=(time.perf_counter() - t1) * 1e3))

    async def _attempt(self, pipe: EdgePipeline, spec: Run) -> EdgeResult:
        """One plan's run, and the local answer when its cloud fails."""
        try:
            return await pipe.run(self.request, spec)
        except CloudFailed as failed:
            return await self._fall_back(pipe, spec, failed)

    async def _fall_back(self, pipe: EdgePipeline, spec: Run, failed: CloudFailed) -> EdgeResult:
        """The cloud failed a run (its replays on other replicas spent, or none to replay on): a warm
        edge answers from what the run had (``answer_locally``); a cold one withdraws what was streamed,
        loads its model and answers with the edge plan in the time left (continuing final text)."""
        if pipe.engine is not None:
            return await answer_locally(pipe, self.request, spec, failed)
        withdraw(spec, failed.reason)
        local = EdgePipeline(await self.edge.load_engine(), None)
        r = await local.run(self.request, self._run_spec(Plan.EDGE, self._left(), spec.on_event))
        return dataclasses.replace(
            r, fallback_reason=failed.reason, fallback_kind=failed.kind, fallback_status=failed.status
        )

    # ---- what the request teaches ------------------------------------------------------------------
    def _after_cloud(self) -> None:
        """The circuit breaker and the draft count from the cloud's part of a request (an escalation's
        too: its session is a cloud call like any other)."""
        link, last = self.edge.link, self.runs[-1]
        if last.plan is not Plan.EDGE:
            kind = last.result.fallback_kind
            if last.result.fallback_reason and kind is not None and kind.counts_against_cloud:
                link.breaker.failure(last.result.fallback_reason)
            else:
                link.breaker.success()
        summary = last.result.summary
        if summary is not None and summary.recommended_drafts:
            link.recommended_drafts = summary.recommended_drafts  # adopt the cloud's count

    def _learn(self, d: Decision) -> None:
        """Each plan that ran, with its own outcome: its measured / predicted latency (the edge attempt
        against the edge's own prediction, an escalation against the escalation's) and the planner's
        estimates (an escalation as a split observation of its own)."""
        edge, runs, n = self.edge, self.runs, self.request.sampling.n
        first = runs[0].plan
        for i, ran in enumerate(runs):
            r = ran.result
            if d.choice is not None and first in d.choice.breakdowns and not r.fallback_reason and d.skipped is None:
                b = d.choice.breakdowns[first]
                predicted = b.attempt_ms if i == 0 else b.escalation_cost_ms
                if predicted > 0:
                    edge.metrics.plan_ratio.labels(ran.plan.value).observe(ran.ms / predicted)
            # before the skip reason is attached: an edge plan run because the cloud was skipped
            # is still a clean measurement of the edge plan
            # the drafts as written (a continuation's text without what it continued: text and count agree)
            seen = dataclasses.replace(r, drafts=r.written_drafts()) if r.continued else r
            edge.planner.observe(
                plan=ran.plan, task=self.task, size=self.size, n=n, result=seen, edge_was=d.edge, escalated=i > 0
            )

    def _result(self, d: Decision, waited_ms: float) -> EdgeResult:
        """The request's result as the user sees it: the runs' (``merged``), with the planner's reason
        and prediction, the request's own times, and why the cloud was skipped when it was."""
        result = merged(self.runs)
        # "cold_start": waiting for the edge model to load
        add: dict = {
            "plan_reason": d.why if not result.plan_reason else f"{d.why}; {result.plan_reason}",
            "timings": result.timings | {"request": (time.perf_counter() - self.t0) * 1e3, "cold_start": waited_ms},
        }
        if d.choice is not None and d.plan in d.choice.breakdowns:
            b = d.choice.breakdowns[d.plan]  # the choice's expectation (an escalation's share included)
            add["predicted"] = {k: v for k, v in b.as_dict().items() if k.endswith("_ms")}
        if d.skipped is not None and not result.fallback_reason:
            add["fallback_reason"], add["fallback_kind"] = d.skip_reason, d.skipped
        return dataclasses.replace(result, **add)

    def _count(self, result: EdgeResult) -> None:
        """A finished request's metrics, by the plan that produced its answer."""
        m, link = self.edge.metrics, self.edge.link
        if result.fallback_reason:
            m.fallbacks.labels(result.fallback_kind or "UNKNOWN").inc()
        if result.replays:
            m.replays.inc(len(result.replays))
        first = self.shown.first_chunk_at if self.shown.first_chunk_at is not None else time.perf_counter()
        m.ttft.observe(first - self.t0)
        m.latency.observe(time.perf_counter() - self.t0)
        m.requests.labels(self.runs[-1].plan.value, result.source).inc()
        m.replicas(link.replicas.values())
