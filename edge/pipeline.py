"""The edge's request pipeline: draft locally, stream drafts over a cloud session, follow retry
advice, replay a failed session on another replica; a cloud that still fails is reported as
``CloudFailed`` with what the run had (its partial result, the drafts already written, the standby's
drafts under way), and the lifecycle (``edge/lifecycle.py``) decides the local answer.

Plans: ``split`` (drafts -> cloud verify + refine), ``edge`` (drafts + local
rules only), ``cloud`` (the cloud answers alone). Drafting runs in a worker
thread (ONNX Runtime blocks); each finished draft is handed to the event loop
and written to the session at once, so the cloud verifies early drafts while
later ones are still being written.

Beside it: ``edge/remote.py`` (the cloud session and its replays), ``edge/result.py`` (what a run
returns), ``edge/failures.py`` (cloud failures as data, ``CloudFailed``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from coinfer import types as t
from coinfer.chat import ChatMessage
from coinfer.edge.draft_engine import DraftResult, OrtDraftEngine
from coinfer.edge.failures import CloudFailed
from coinfer.edge.remote import Remote
from coinfer.edge.request import SolveRequest, ValidRequest, compiled
from coinfer.edge.result import EdgeResult, ResultBuilder
from coinfer.edge.sampling import Sampling
from coinfer.edge.shown import AnswerView
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.types import Plan  # noqa: F401 - re-exported: callers name the plan with the pipeline
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


LOCAL_FINISH_S = 0.1
"""Local drafting stops this long before the request's deadline: the rules and the reply fit in it."""
CLOUD_MARGIN_S = 0.3
"""The cloud's deadline is this much (at most a tenth of the request's) shorter than the edge's: the
cloud's best answer at its deadline travels back before the edge stops waiting."""


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


class LocalStandby:
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
        """The drafts under way, if they started, for the fallback to use or cancel (``CloudFailed.standby``);
        a standby that has not started is cancelled by ``cancel`` now."""
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

    async def replica_ready(self, wait_s: float = 2.0) -> bool:
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

    async def draft_round(
        self,
        task_prompt: str,
        s: Sampling,
        *,
        start: int,
        t0: float,
        emit: Callable[[t.Draft], Awaitable[None] | None],
        stop_at: float | None = None,
        prefix: str = "",
        greedy: int = 0,
        continues: int = 0,
        greedy_tokens: int = 0,
    ) -> list[t.Draft]:
        """Write ``s.n`` drafts in a worker thread; ``emit`` each one on the loop as it finishes (what it returns
        is awaited before the next: the draft's write to the cloud, in this task). At ``stop_at``
        (``time.perf_counter()``) the drafts still being written end there, truncated: the deadline bounds drafting.
        ``prefix``: answer text the drafts continue (each draft's text begins with it); ``greedy``: the first
        so many are written greedily (``Draft.greedy``), ending after ``greedy_tokens`` (0: the round's budget);
        ``continues``: the ``DraftFrom`` round they answer."""
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
                greedy=greedy,
                greedy_tokens=greedy_tokens,
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
                    greedy=r.index < greedy,
                    continues=continues,
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
    def local_answer(rules: RuleSet, drafts: list[t.Draft], shown: str = "") -> tuple[t.Draft | None, bool, dict, bool]:
        """Best draft by (passes the rules -- degenerate repetition included --, agreement on the
        extracted answer, finished before its token budget, mean logprob): (draft, valid, extracted
        fields, repaired). The best invalid one if none is valid. A truncated draft loses to a finished one
        of any score: its higher mean logprob is that of an answer that never reached its end. Where a
        preset's exact checkers judge, or an open request's ``arithmetic`` rule, a draft that fails them is
        judged repaired (``RuleSet.check_repaired``, as the cloud's judge does): the draft returned is then
        the repaired text, unless the repair would rewrite text already ``shown`` as final."""
        if not drafts:
            return None, False, {}, False
        checked = [rules.check_repaired(d.text) for d in drafts]
        checked = [c if c[2].startswith(shown) else (*rules.check(d.text), d.text, "") for c, d in zip(checked, drafts)]
        keys = [rules.task.answer_key(parsed) if res.valid else None for res, parsed, _, _ in checked]
        agree = {k: keys.count(k) for k in keys if k is not None}
        best = max(
            range(len(drafts)),
            key=lambda i: (checked[i][0].valid, agree.get(keys[i], 0), not drafts[i].truncated, drafts[i].mean_logprob),
        )
        res, parsed, text, repaired = checked[best]
        d = dataclasses.replace(drafts[best], text=text) if repaired else drafts[best]
        return d, res.valid, dict(parsed.fields) if parsed.ok else {}, bool(repaired)

    async def finish_local(
        self, result: ResultBuilder, ruleset: RuleSet, drafts: list[t.Draft], shown: str = ""
    ) -> None:
        """The best of ``drafts`` as the answer (the request's rules over every one: off the loop);
        ``shown``: the text already streamed as final, which every draft continues."""
        best, result.valid, result.fields, repaired = await asyncio.to_thread(self.local_answer, ruleset, drafts, shown)
        result.answer = best.text if best is not None else ""
        result.finish_reason = t.FinishReason.LENGTH if best is not None and best.truncated else t.FinishReason.STOP
        if repaired:
            result.refine_mode = t.RefineMode.REPAIRED

    async def local_round(
        self, request: ValidRequest, *, start: int, t0: float, stop_at: float, prefix: str = ""
    ) -> list[t.Draft]:
        """One round of the request's drafts, not emitted (a fallback's: the local answer is sent whole),
        indexed from ``start``, continuing ``prefix``, ending by ``stop_at``."""
        prompt = self.engine.render(request.conversation)
        return await self.draft_round(
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
        identity = self.engine.identity if self.engine is not None else ""
        req = request.open_request(cloud_deadline_ms, len(run.drafts) if run.drafts else s.n, identity)
        result = ResultBuilder(task=request.req.task)
        model_prompt = self.engine.render(request.conversation) if self.engine is not None else ""
        local_stop = t0 + deadline_s - LOCAL_FINISH_S  # local drafts end in time for the rules and the reply
        if run.plan is Plan.EDGE or self.stub is None:
            result.drafts = await self.draft_round(
                model_prompt, s, start=0, t0=t0, emit=run.emit, stop_at=local_stop, prefix=run.shown.final
            )
            result.continue_with(result.drafts, run.shown.final)
            await self.finish_local(result, request.ruleset, result.drafts, run.shown.final)
            result.rounds = 1
            result.timings = {"drafting": (time.perf_counter() - t0) * 1e3, "total": (time.perf_counter() - t0) * 1e3}
            return result.freeze()
        standby = None
        if run.plan is Plan.CLOUD and self.engine is not None and not run.drafts and run.local_reserve_s > 0:
            standby = LocalStandby(
                lambda: self.draft_round(model_prompt, s, start=0, t0=t0, emit=_ignore, stop_at=local_stop),
                max(0.0, deadline_s - run.local_reserve_s),
            )
        try:
            remote = Remote(
                pipe=self, request=request, req=req, run=run, model_prompt=model_prompt, t0=t0, standby=standby
            )
            return (await remote.solve(result)).freeze()
        finally:
            if standby is not None:
                await standby.cancel()  # unless CloudFailed carries its drafts: the fallback's to use or cancel
