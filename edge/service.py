"""The edge daemon's core, behind both front ends (gRPC EdgeService and the OpenAI HTTP API):
request validation, the model's lifecycle (cold -> loading -> warm), plan choice with the
circuit breaker, and one event stream per request. Transport-free: domain types in and out,
``coinfer.errors`` for bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from coinfer import types as t
from coinfer.chat import ChatFormat, ChatMessage, conversation, question_of
from coinfer.edge.config import PLANS, EdgeConfig
from coinfer.edge.draft_engine import OrtDraftEngine
from coinfer.edge.lifecycle import CloudTokens, Outcome, Ran, RequestLifecycle
from coinfer.edge.link import CloudLink
from coinfer.edge.metrics import EdgeMetrics
from coinfer.edge.onnx_lm import ACCELERATORS, default_providers, model_files
from coinfer.edge.pipeline import EdgeResult, Plan, cloud_failed
from coinfer.edge.planner import probes
from coinfer.edge.planner.cost import Choice, cold_start_ms
from coinfer.edge.planner.estimates import Estimates
from coinfer.edge.planner.planner import EdgeState, Planner
from coinfer.edge.sampling import Sampling
from coinfer.errors import InvalidArgument, Unavailable, require
from coinfer.extract import Extraction
from coinfer.rules import Rule, RuleSet
from coinfer.tasks import TASKS, get_task
from coinfer.validate import check_deadline, check_question, check_request_id

log = logging.getLogger(__name__)


@dataclass
class SolveRequest:
    prompt: str
    """The question as one user turn ("" when ``messages`` carries the conversation)."""
    task: str = ""
    """Empty: the task preset whose problem format the question matches, else an open request."""
    rules: list[Rule] = field(default_factory=list)
    sampling: t.SamplingParams | None = None
    """Sampling of the drafts and of the cloud's refinement (None: the daemon's draft defaults
    and the cloud's refinement defaults)."""
    num_drafts: int = 0
    plan: str = "auto"
    deadline_ms: int = 0
    request_id: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    """The conversation (system message and history kept)."""
    extraction: Extraction = field(default_factory=Extraction)
    refine: t.SamplingParams | None = None
    """Sampling of the cloud's refinement; None: ``sampling`` when given, else the cloud's defaults."""

    @property
    def question(self) -> str:
        return question_of(conversation(self.prompt, self.messages))


@dataclass
class Done:
    """The last event of a request."""

    result: EdgeResult
    plan: str
    """The plan that produced the answer: the last of ``plans`` ("split" after an escalation)."""
    plans: list[str] = field(default_factory=list)
    """The plans that ran, in order: the planner's choice first (["edge", "split"]: auto's edge
    answer failed the rules and a split refined its drafts)."""
    cloud_tokens: CloudTokens = field(default_factory=CloudTokens)

    def info(self) -> dict:
        """What both APIs report about a finished request besides its answer (gRPC SolveResult
        field names)."""
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
            "refine_mode": r.refine_mode,
            "task": r.task,
            "replays": list(r.replays),
            "replica": r.summary.replica if r.summary is not None else "",
            "cloud_tokens": dataclasses.asdict(self.cloud_tokens),
            "finish_reason": r.finish_reason,
        }


LOCAL_RESERVE_FACTOR = 1.5
LOCAL_RESERVE_MIN_S = 0.25
"""A cloud plan's local fallback starts 1.5x its predicted drafting time + 0.25 s before the deadline
(the prediction is a mean; the margin covers the rules and the answer's trip to the client)."""


def infer_task(prompt: str) -> str:
    """The task preset whose problem format ``prompt`` matches (apps need not name it); "" (an
    open request) when none does."""
    for name, task in TASKS.items():
        try:
            task.parse_problem(prompt)
            return name
        except InvalidArgument:
            continue
    return ""


def _log_load_failure(task: asyncio.Task) -> None:
    """A background load that failed is retried by the next request that needs the model; say why now."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("background draft model load failed: %s", task.exception())


class EdgeCore:
    def __init__(self, cfg: EdgeConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.link = CloudLink(cfg)
        self.metrics = EdgeMetrics()
        self.engine: OrtDraftEngine | None = None
        self.model_state = t.ModelState.COLD
        self.model_load_ms = 0.0
        self.active = 0
        self._load_lock = asyncio.Lock()
        self._load_started = 0.0
        self.planner = Planner(Estimates.open(cfg.planner_state), cfg.quality_floor, cfg.cloud_thrift)
        self.model_bytes = sum(f.stat().st_size for f in model_files(cfg.model)) if Path(cfg.model).is_dir() else 0
        self._probe: asyncio.Task | None = None
        # a cold model's PCIe term needs to know where it will run before any session exists
        self._planned_gpu = (cfg.provider_list or default_providers())[0] in ACCELERATORS
        self._warming: asyncio.Task | None = None
        """The background load started by a cloud request on a cold edge (held: the loop keeps
        only weak references to tasks)."""

    async def start(self) -> None:
        await self.link.start()
        if self.cfg.warm:
            await self.ensure_engine()
        if self.cfg.probe_on_start:
            await self.calibrate()

    async def calibrate(self) -> list[str]:
        """Probe what applies now: disk/PCIe always, decode steps once warm, network/queue with a cloud."""
        stub = None
        if self.link.enabled:
            from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

            for _ in range(50):  # give a fresh channel a moment to connect
                if self.link.serving:
                    break
                await asyncio.sleep(0.05)
            stub = pb_grpc.CoinferCloudStub(self.link.channel)
        model = Path(self.cfg.model) / "model.onnx"
        done = await probes.calibrate(
            self.planner.est, model if model.is_file() else None, self.engine.lm if self.engine else None, stub
        )
        self._pool_queue()
        return done

    def _pool_queue(self) -> None:
        """The planner's queue term from the pool's best serving replica (a Status call through the
        balanced channel reaches whichever replica is next, not the one a session would use)."""
        best = self.link.best()
        if best is not None and best.last_seen:
            probes.observe_queue(self.planner.est, best.queue_depth)

    def _edge_state(self) -> EdgeState:
        gpu = self.engine.providers[0] in ACCELERATORS if self.engine else self._planned_gpu
        remaining = 0.0
        if self.model_state is t.ModelState.LOADING:
            cold = dataclasses.replace(
                self.planner.edge_profile(EdgeState(self.model_bytes, t.ModelState.COLD, gpu=gpu)), first_run_ms=0.0
            )  # the "loading" state adds it itself
            remaining = max(0.0, cold_start_ms(cold) - (time.perf_counter() - self._load_started) * 1e3)
        fresh = self.engine is None or self.engine.runs == 0
        return EdgeState(self.model_bytes, self.model_state, remaining, gpu, fresh)

    def _maybe_reprobe(self) -> None:
        est = self.planner.est
        if (
            self.link.enabled
            and (self._probe is None or self._probe.done())
            and est.stale("rtt_ms", self.cfg.reprobe_s)
        ):
            est.updated["rtt_ms"] = time.time()  # one probe at a time
            from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

            self._probe = asyncio.create_task(probes.calibrate(est, stub=pb_grpc.CoinferCloudStub(self.link.channel)))

    async def ensure_engine(self) -> OrtDraftEngine:
        """Load (manifest check, session, one warm-up token) once; concurrent callers wait for it."""
        async with self._load_lock:
            if self.engine is None:
                self.model_state = t.ModelState.LOADING
                t0 = self._load_started = time.perf_counter()
                try:
                    engine = await asyncio.to_thread(
                        OrtDraftEngine,
                        Path(self.cfg.model),
                        self.cfg.provider_list or None,
                        self.cfg.threads or None,
                        allow_unverified=self.cfg.allow_unverified,
                    )
                    warm_ms = await asyncio.to_thread(engine.warm_up)
                except BaseException:
                    self.model_state = t.ModelState.COLD
                    raise
                self.engine = engine
                self.model_load_ms = (time.perf_counter() - t0) * 1e3
                self.model_state = t.ModelState.WARM
                # session creation alone: the cost model's disk term already covers the read
                self.planner.est.observe("session_ms", engine.session_ms)
                self.planner.est.observe("warmup_ms", warm_ms)
                log.info("draft model warm in %.0f ms on %s", self.model_load_ms, engine.providers)
        return self.engine

    async def _engine_for_request(self) -> OrtDraftEngine:
        """The engine a request needs. A model that fails to load (tampered, truncated, unreadable) is
        the server's fault, not the request's: UNAVAILABLE / 503 with a message that names no path;
        the detail goes to the log."""
        try:
            return await self.ensure_engine()
        except Exception as exc:  # noqa: BLE001 - ManifestError, ONNX Runtime's load errors, OSError
            log.error("draft model failed to load: %s", exc)
            raise Unavailable(
                "model: the edge's draft model failed to load (see the daemon's log); retry later"
            ) from None

    @functools.cached_property
    def _tokenizer(self) -> tuple[Tokenizer, ChatFormat]:
        """The draft model's tokenizer and chat format while the model itself is not loaded (usage counts)."""
        return Tokenizer.from_file(str(Path(self.cfg.model) / "tokenizer.json")), ChatFormat.from_dir(self.cfg.model)

    def usage(self, req: SolveRequest, done: Done) -> dict:
        """OpenAI ``usage`` in the draft tokenizer's tokens: the rendered conversation and the answer."""
        tok, chat = (self.engine.tokenizer, self.engine.chat) if self.engine is not None else self._tokenizer
        prompt = chat.render(conversation(req.prompt, req.messages))
        p = len(tok.encode(prompt, add_special_tokens=not chat.templated).ids)
        c = len(tok.encode(done.result.answer, add_special_tokens=False).ids)
        return {
            "prompt_tokens": p,
            "completion_tokens": c,
            "total_tokens": p + c,
            "draft_tokens": sum(d.num_tokens for d in done.result.drafts),
        }

    def status(self) -> dict:
        return {
            "model": self.cfg.model_name,
            "model_state": self.model_state,
            "model_load_ms": self.model_load_ms,
            "cloud_circuit": self.link.breaker.state if self.link.enabled else "disabled",
            "cloud_serving": self.link.serving,
            "recommended_drafts": self.link.recommended_drafts,
            "active": self.active,
            "replicas": [r.as_dict() for r in self.link.replicas.values()],
        }

    def _validate(self, req: SolveRequest) -> tuple[Sampling, float]:
        try:
            return self._check(req)
        except (ValueError, RecursionError):  # a task parser on hostile text (a 5,000-digit number)
            raise InvalidArgument("prompt: cannot be parsed (a number or nesting beyond any limit)") from None

    def _check(self, req: SolveRequest) -> tuple[Sampling, float]:
        c = self.cfg
        check_request_id(req.request_id)
        check_question(req.prompt, req.messages, c.max_prompt_chars)
        req.extraction.validate("extraction")
        req.task = req.task or infer_task(req.question)
        task = get_task(req.task, "task")
        RuleSet(req.rules, task, task.parse_problem(req.question), "rules", req.extraction)  # bad rules: 400 now
        require(req.plan in PLANS, "plan", f"must be one of {', '.join(PLANS)}, got {req.plan!r}")
        require(0 <= req.num_drafts <= c.max_drafts, "num_drafts", f"must be in 0..{c.max_drafts}")
        check_deadline(req.deadline_ms)
        base = req.sampling or t.SamplingParams()
        n = req.num_drafts or min(c.max_drafts, self.link.recommended_drafts)
        s = Sampling(**{f.name: getattr(base, f.name) for f in dataclasses.fields(t.SamplingParams)}, n=n)
        s.validate("sampling", c.max_drafts, c.max_new_tokens)
        return s, (req.deadline_ms or c.deadline_ms) / 1e3

    def _plan(self, req: SolveRequest, n: int, size: tuple[int, int]) -> tuple[Plan, str, str, EdgeState, object]:
        """(plan to run, why the cloud is skipped if it is, why this plan, edge state, choice)."""
        asked = self.cfg.plan if req.plan == "auto" and self.cfg.plan != "auto" else req.plan
        edge = self._edge_state()
        self._pool_queue()
        # an open circuit past its cool-down is offered too: the half-open trial is the only way back
        # to the cloud (taken by allow() below only if the plan chosen uses the cloud)
        cloud_ok = self.link.enabled and self.link.breaker.would_allow()
        choice = None
        if asked == "auto":
            choice = self.planner.choose(req.task or "open", *size, n, edge, cloud_ok)
            asked, why = choice.plan, choice.reason
        else:
            why = "requested"
        if asked == "edge":
            return Plan.EDGE, "", why, edge, choice
        if not self.link.enabled:
            return Plan.EDGE, "no cloud configured", why, edge, choice
        if not self.link.breaker.allow():
            return Plan.EDGE, f"cloud circuit {self.link.breaker.state}", why, edge, choice
        return (Plan.CLOUD if asked == "cloud" else Plan.SPLIT), "", why, edge, choice

    async def _engine_for(self, plan: Plan) -> OrtDraftEngine | None:
        """The engine ``plan`` needs; None for a cloud plan on a cold edge, which is then served from
        the cloud while the edge model warms in the background."""
        if plan is Plan.CLOUD and self.engine is None:
            if self._warming is None or self._warming.done():
                self._warming = asyncio.create_task(self.ensure_engine())
                self._warming.add_done_callback(_log_load_failure)
            return None
        return await self._engine_for_request()

    def _learn(
        self,
        runs: tuple[Ran, ...],
        choice: Choice | None,
        skipped: str,
        task: str,
        size: tuple[int, int],
        n: int,
        edge_was: EdgeState,
    ) -> None:
        """Each plan that ran, with its own outcome: its measured / predicted latency (the edge attempt
        against the edge's own prediction, an escalation against the escalation's) and the planner's
        estimates (an escalation as a split observation of its own)."""
        for i, ran in enumerate(runs):
            r = ran.result
            if choice is not None and runs[0].plan.value in choice.breakdowns and not r.fallback_reason and not skipped:
                b = choice.breakdowns[runs[0].plan.value]
                predicted = b.attempt_ms if i == 0 else b.escalation_cost_ms
                if predicted > 0:
                    self.metrics.plan_ratio.labels(ran.plan.value).observe(ran.ms / predicted)
            # before the skip reason is attached: an edge plan run because the cloud was skipped
            # is still a clean measurement of the edge plan
            self.planner.observe(ran.plan.value, task, *size, n, r, edge_was, escalated=i > 0)

    def _after_cloud(self, runs: tuple[Ran, ...]) -> None:
        """The circuit breaker and the draft count from the cloud's part of a request (an escalation's
        too: its session is a cloud call like any other)."""
        last = runs[-1]
        if last.plan is not Plan.EDGE:
            reason = last.result.fallback_reason
            if reason and cloud_failed(last.result.fallback_kind):
                self.link.breaker.failure(reason)
            else:
                self.link.breaker.success()
        summary = last.result.summary
        if summary is not None and summary.recommended_drafts:
            self.link.recommended_drafts = summary.recommended_drafts  # adopt the cloud's count

    async def solve(self, req: SolveRequest) -> AsyncIterator[object]:
        """Events: t.Draft, t.Verdict, t.AnswerChunk ..., then one Done."""
        s, deadline_s = await asyncio.to_thread(self._validate, req)  # parses and compiles client data
        t0 = time.perf_counter()  # the user's clock: waiting for a cold model counts
        size = self.planner.prompt_size("\n".join(m.content for m in conversation(req.prompt, req.messages)))
        plan, skipped, why, edge_was, choice = self._plan(req, s.n, size)
        self._maybe_reprobe()
        engine = await self._engine_for(plan)
        self.metrics.plans.labels(plan.value).inc()
        q: asyncio.Queue = asyncio.Queue()
        waited_ms = (time.perf_counter() - t0) * 1e3
        first: list[float] = []
        streamed: list[bool] = []  # answer chunks the user holds (withdrawn by an AnswerReset)

        def on_event(ev: object) -> None:
            if isinstance(ev, t.Draft):
                self.metrics.drafts.inc()
                self.metrics.tokens.inc(ev.num_tokens)
            elif isinstance(ev, t.AnswerChunk):
                if not first:
                    first.append(time.perf_counter() - t0)
                streamed.append(True)
            elif isinstance(ev, t.AnswerReset):
                streamed.clear()
            q.put_nowait(ev)

        self.active += 1
        self.metrics.active.inc()
        reserve = 0.0
        if plan is Plan.CLOUD:  # the local answer a cloud plan falls back to starts this long before the deadline
            predicted = self.planner.local_ms(req.task or "open", *size, s.n, edge_was)
            reserve = LOCAL_RESERVE_FACTOR * predicted / 1e3 + LOCAL_RESERVE_MIN_S
        lifecycle = RequestLifecycle(
            req,
            s,
            plan,
            engine,
            auto=choice is not None,
            deadline_s=deadline_s,
            t0=t0,
            on_event=on_event,
            local_reserve_s=reserve,
            link=self.link,
            replays=self.cfg.replays,
            load_engine=self._engine_for_request,
        )
        job = asyncio.create_task(lifecycle.run())
        job.add_done_callback(lambda _: q.put_nowait(None))
        try:
            while (ev := await q.get()) is not None:
                if not isinstance(ev, t.Summary):
                    yield ev
            outcome = job.result()
            runs = outcome.runs
            self._after_cloud(runs)
            self._learn(runs, choice, skipped, req.task or "open", size, s.n, edge_was)
            result = self._result(outcome, plan, why, skipped, choice, t0, waited_ms)
            if not first:
                first.append(time.perf_counter() - t0)
            if not streamed:
                yield t.AnswerChunk(result.answer)  # a local answer arrives whole
            self._count(result, runs[-1].plan, first[0], t0)
            yield Done(result=result, plan=outcome.plan, plans=outcome.plans, cloud_tokens=outcome.cloud_tokens)
        finally:
            if not job.done():
                job.cancel()
            self.active -= 1
            self.metrics.active.dec()

    def _result(
        self, outcome: Outcome, plan: Plan, why: str, skipped: str, choice: object, t0: float, waited_ms: float
    ) -> EdgeResult:
        """The request's result as the user sees it: the lifecycle's, with the planner's reason and
        prediction, the request's own times, and why the cloud was skipped when it was."""
        result = outcome.result
        # the request as the user saw it; "cold_start": waiting for the edge model to load
        add: dict = {
            "plan_reason": why if not result.plan_reason else f"{why}; {result.plan_reason}",
            "timings": result.timings | {"request": (time.perf_counter() - t0) * 1e3, "cold_start": waited_ms},
        }
        if choice is not None and plan.value in choice.breakdowns:
            b = choice.breakdowns[plan.value]  # the choice's expectation (an escalation's share included)
            add["predicted"] = {k: v for k, v in b.as_dict().items() if k.endswith("_ms")}
        if skipped and not result.fallback_reason:
            add["fallback_reason"] = skipped
            add["fallback_kind"] = "CIRCUIT_OPEN" if self.link.enabled else "NO_CLOUD"
        return dataclasses.replace(result, **add)

    def _count(self, result: EdgeResult, plan: Plan, ttft_s: float, t0: float) -> None:
        """A finished request's metrics, by the plan that produced its answer."""
        if result.fallback_reason:
            self.metrics.fallbacks.labels(result.fallback_kind or "UNKNOWN").inc()
        if result.replays:
            self.metrics.replays.inc(len(result.replays))
        self.metrics.ttft.observe(ttft_s)
        self.metrics.latency.observe(time.perf_counter() - t0)
        self.metrics.requests.labels(plan.value, result.source).inc()
        self.metrics.circuit.set(1 if self.link.breaker.state is t.BreakerState.OPEN else 0)
        self.metrics.replicas(self.link.replicas.values())

    async def close(self) -> None:
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
        await self.link.close()
