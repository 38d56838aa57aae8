"""The edge daemon's core, behind both front ends (gRPC EdgeService and the OpenAI HTTP API): a router.
It owns the daemon's parts (the cloud link and its breaker, the planner, the metrics) and the draft
model's state (cold -> loading -> warm); a request is checked once (``edge/request.py``) and handed to
its ``RequestLifecycle`` (``edge/lifecycle.py``: the plan, the fallbacks, what the request teaches),
whose events it passes on. Transport-free: domain types in and out, ``coinfer.errors`` for bad input."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from tokenizers import Tokenizer

from coinfer import types as t
from coinfer.chat import ChatFormat, conversation
from coinfer.edge.config import EdgeConfig
from coinfer.edge.draft_engine import OrtDraftEngine
from coinfer.edge.lifecycle import CloudTokens, Done, RequestLifecycle  # noqa: F401 - re-exported for the front ends
from coinfer.edge.link import CloudLink
from coinfer.edge.metrics import EdgeMetrics
from coinfer.edge.onnx_lm import ACCELERATORS, default_providers, model_files
from coinfer.edge.pipeline import Event, Plan
from coinfer.edge.planner import probes
from coinfer.edge.planner.cost import cold_start_ms
from coinfer.edge.planner.estimates import Estimates
from coinfer.edge.planner.planner import EdgeState, Planner
from coinfer.edge.request import SolveRequest, checked, infer_task  # noqa: F401 - re-exported (edge.plan, front ends)
from coinfer.errors import Unavailable
from coinfer.rules import request_check_size
from coinfer.serving.offload import run_sized

log = logging.getLogger(__name__)


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
        self.link.breaker.on_change = self._circuit_moved
        self.engine: OrtDraftEngine | None = None
        self.model_state = t.ModelState.COLD
        self.model_load_ms = 0.0
        self.active = 0
        self._load_lock = asyncio.Lock()
        self._load_started = 0.0
        self.planner = Planner(
            Estimates.open(cfg.planner_state, tau_s=cfg.planner_tau_s), quality_floor=cfg.quality_floor
        )
        self.model_bytes = sum(f.stat().st_size for f in model_files(cfg.model)) if Path(cfg.model).is_dir() else 0
        self._probe: asyncio.Task | None = None
        self._probe_started = -float("inf")
        """Monotonic seconds when the last background re-probe began (a failed one is not retried at once)."""
        # a cold model's PCIe term needs to know where it will run before any session exists
        self._planned_gpu = (cfg.provider_list or default_providers())[0] in ACCELERATORS
        self._warming: asyncio.Task | None = None
        """The background load started by a cloud request on a cold edge (held: the loop keeps
        only weak references to tasks)."""

    def _circuit_moved(self, state: t.BreakerState, why: str) -> None:
        log.log(logging.INFO if state is t.BreakerState.CLOSED else logging.WARNING, "cloud circuit %s: %s", state, why)
        self.metrics.circuit_moved(state)

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
        self.pool_queue()
        return done

    def pool_queue(self) -> None:
        """The planner's queue term from the pool's best serving replica (a Status call through the
        balanced channel reaches whichever replica is next, not the one a session would use)."""
        best = self.link.best()
        if best is not None and best.last_seen:
            probes.observe_queue(self.planner.est, best.queue_depth)

    def edge_state(self) -> EdgeState:
        gpu = self.engine.providers[0] in ACCELERATORS if self.engine else self._planned_gpu
        remaining = 0.0
        if self.model_state is t.ModelState.LOADING:
            cold = dataclasses.replace(
                self.planner.edge_profile(EdgeState(model_bytes=self.model_bytes, state=t.ModelState.COLD, gpu=gpu)),
                first_run_ms=0.0,
            )  # the "loading" state adds it itself
            remaining = max(0.0, cold_start_ms(cold) - (time.perf_counter() - self._load_started) * 1e3)
        fresh = self.engine is None or self.engine.runs == 0
        return EdgeState(
            model_bytes=self.model_bytes, state=self.model_state, loading_remaining_ms=remaining, gpu=gpu, fresh=fresh
        )

    def maybe_reprobe(self) -> None:
        """Re-probe the network and the queue in the background once they are ``reprobe_s`` old (one probe at a
        time, and one per ``reprobe_s`` however it went)."""
        est = self.planner.est
        now = time.monotonic()
        if (
            self.link.enabled
            and (self._probe is None or self._probe.done())
            and est.age_s("rtt_ms") > self.cfg.reprobe_s
            and now - self._probe_started > self.cfg.reprobe_s
        ):
            self._probe_started = now
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

    async def load_engine(self) -> OrtDraftEngine:
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

    async def engine_for(self, plan: Plan) -> OrtDraftEngine | None:
        """The engine ``plan`` needs; None for a cloud plan on a cold edge, which is then served from
        the cloud while the edge model warms in the background."""
        if plan is Plan.CLOUD and self.engine is None:
            if self._warming is None or self._warming.done():
                self._warming = asyncio.create_task(self.ensure_engine())
                self._warming.add_done_callback(_log_load_failure)
            return None
        return await self.load_engine()

    async def begin(self, req: SolveRequest) -> RequestLifecycle:
        """The request checked once (its rules compiled: off the loop) and handed to its lifecycle, not yet run:
        the front ends read its events (``RequestLifecycle.events``) and, streaming, what the user has seen of
        its answer (``RequestLifecycle.shown``)."""
        size = request_check_size(req)  # a short preset request: checked faster than a thread hop
        request = await run_sized(size, checked, req, self.cfg, self.link.recommended_drafts)
        return RequestLifecycle(self, request)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """One request counted in flight (``status``, the metrics) while it runs."""
        self.active += 1
        self.metrics.active.inc()
        try:
            yield
        finally:
            self.active -= 1
            self.metrics.active.dec()

    async def solve(self, req: SolveRequest) -> AsyncIterator[Event | Done]:
        """Events: t.Draft, t.Verdict, t.AnswerChunk, t.AnswerReset ..., then one Done (``begin``, then the
        lifecycle's events: for tools and tests; the front ends call those two themselves)."""
        lifecycle = await self.begin(req)
        # closed with this generator, at once (a client gone): its run and cloud call end with it
        async with contextlib.aclosing(lifecycle.events()) as events:
            async for ev in events:
                yield ev

    async def close(self) -> None:
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
        await self.planner.est.flush()  # the last estimates written before the daemon goes
        await self.link.close()
