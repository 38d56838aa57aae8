"""One edge request's lifecycle, owned by one object: the plan chosen, the local answer when the
cloud fails while the edge model is cold, and auto's escalation of a rule-failing edge answer to a
split with the same drafts (a cloud session's replays on other replicas happen inside the pipeline
run). ``EdgeCore`` validates, asks the planner, hands the request over, and records metrics and
learns from the ``Outcome``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from coinfer.edge.draft_engine import OrtDraftEngine
from coinfer.edge.link import CloudLink
from coinfer.edge.pipeline import CloudFailed, EdgePipeline, EdgeResult, Plan


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


@dataclass(frozen=True)
class Outcome:
    """What a request's lifecycle produced: every plan that ran, in order, and the request's result
    (the last plan's answer, with the stage times of every plan that ran)."""

    runs: tuple[Ran, ...]
    result: EdgeResult

    @property
    def plan(self) -> str:
        """The plan that produced the answer."""
        return self.runs[-1].plan.value

    @property
    def plans(self) -> list[str]:
        return [r.plan.value for r in self.runs]

    @property
    def cloud_tokens(self) -> CloudTokens:
        return CloudTokens.of([r.result for r in self.runs])


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


@dataclass
class RequestLifecycle:
    """Runs one validated request under the plan the planner chose (``auto``: the planner chose it,
    so a rule-failing edge answer may escalate)."""

    req: object  # edge.service.SolveRequest
    sampling: object  # edge.sampling.Sampling
    plan: Plan
    engine: OrtDraftEngine | None
    auto: bool
    deadline_s: float
    t0: float
    on_event: Callable[[object], None]
    local_reserve_s: float
    link: CloudLink
    replays: int
    load_engine: Callable[[], Awaitable[OrtDraftEngine]]
    """Loads the edge model for a request that needs it now (the cold-cloud fallback)."""
    runs: list[Ran] = field(default_factory=list)

    def _left(self) -> float:
        return max(0.1, self.deadline_s - (time.perf_counter() - self.t0))

    async def _solve(self, pipe: EdgePipeline, plan: Plan, deadline_s: float, **extra) -> EdgeResult:
        req = self.req
        # the user's sampling reaches the refinement too (OpenAI fidelity); unset: the cloud's defaults
        kw = {"messages": req.messages, "extraction": req.extraction, "refine": req.refine or req.sampling}
        if self.local_reserve_s and plan is Plan.CLOUD:
            kw["local_reserve_s"] = self.local_reserve_s
        return await pipe.solve(
            req.task,
            req.prompt,
            req.rules,
            self.sampling,
            plan,
            deadline_s,
            req.request_id,
            self.on_event,
            **kw,
            **extra,
        )

    async def run(self) -> Outcome:
        """The plan chosen; under auto, a rule-failing edge answer escalates to a split with its drafts."""
        plan = self.plan
        pipe = EdgePipeline(self.engine, self.link.channel if plan is not Plan.EDGE else None, self.replays)
        try:
            r = await self._solve(pipe, plan, self.deadline_s)
        except CloudFailed as exc:  # the cloud plan failed while the edge was cold: load it and answer locally
            r = await self._solve(EdgePipeline(await self.load_engine(), None), Plan.EDGE, self._left())
            r = dataclasses.replace(r, fallback_reason=str(exc), fallback_kind=exc.kind)
        self.runs.append(Ran(plan=plan, result=r, ms=(time.perf_counter() - self.t0) * 1e3))
        if (
            plan is Plan.EDGE
            and self.auto
            and not r.valid
            and r.drafts
            and not r.fallback_reason
            and self.link.enabled
            and self.link.breaker.allow()
        ):
            # auto chose the edge, but its answer failed the rules: a healthy cloud verifies and
            # refines the same drafts (sent as they are: no drafting twice)
            t1 = time.perf_counter()
            up = EdgePipeline(self.engine, self.link.channel, self.replays)
            r2 = await self._solve(up, Plan.SPLIT, self._left(), drafts=r.drafts)
            r2 = dataclasses.replace(r2, plan_reason="edge answer failed the rules: escalated to split with its drafts")
            self.runs.append(Ran(plan=Plan.SPLIT, result=r2, ms=(time.perf_counter() - t1) * 1e3))
        return Outcome(tuple(self.runs), merged(self.runs))
