"""The cloud's work behind the servicer: admission, sessions, cloud-only generation, status.

Transport-free: takes and returns domain types, raises ``coinfer.errors``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator

from coinfer import types as t
from coinfer.cloud.config import CloudConfig
from coinfer.cloud.engine import TargetEngine, metered
from coinfer.cloud.learning import WeightLearner
from coinfer.cloud.load import DraftCountController
from coinfer.cloud.metrics import CloudMetrics
from coinfer.cloud.policy import RoundOdds
from coinfer.cloud.session import EdgeItem, Session
from coinfer.errors import InvalidArgument, Reason, ResourceExhausted, Unavailable
from coinfer.rules import RuleSet, request_check_size
from coinfer.serving import logs
from coinfer.serving.offload import run_sized
from coinfer.tasks import get_task
from coinfer.validate import MAX_NEW_TOKENS, check_deadline, check_draft_model, check_question, check_request_id

log = logging.getLogger(__name__)


class CloudCore:
    """Owns the engine handle, the admission limits and the load controller."""

    def __init__(self, cfg: CloudConfig, engine: TargetEngine | None = None) -> None:
        self.cfg = cfg
        self.engine = engine
        self.active = 0
        self.per_edge: collections.Counter[str] = collections.Counter()
        """Sessions in flight per caller (``Limits.max_sessions_per_edge``)."""
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.controller = DraftCountController()
        p = cfg.policy
        self.round_odds = RoundOdds()
        self.learner = WeightLearner.open(p.a, p.b, p.g, every=p.learn_every, alpha=p.learn_alpha, path=cfg.state_path)
        self.metrics = CloudMetrics()
        self._publish_weights()

    def _publish_weights(self) -> None:
        w = self.learner.weights
        for name in ("a", "b", "g"):
            self.metrics.weights.labels(name).set(getattr(w, name))

    def sample_load(self) -> None:
        """One load sample into the controller (called at a fixed rate by the server)."""
        st = self.engine.stats() if self.engine else None
        self.controller.update(st.load if st else 0.0)
        self.metrics.recommended.set(self.controller.recommended)
        self.metrics.load.set(self.controller.smoothed)
        if st is not None:
            self.metrics.engine.labels("running").set(st.running)
            self.metrics.engine.labels("waiting").set(st.waiting)
            self.metrics.kv_usage.set(st.kv_cache_usage)

    def status(self) -> t.Status:
        st = self.engine.stats() if self.engine else None
        w = self.learner.weights
        return t.Status(
            # waiting: vLLM's own scheduler queue; before its first stats, requests beyond max_num_seqs
            queue_depth=(st.waiting or max(0, st.running - st.max_num_seqs)) if st else 0,
            running=st.running if st else 0,
            utilisation=st.load if st else 0.0,
            recommended_drafts=self.controller.recommended,
            active_sessions=self.active,
            model=self.cfg.engine.model_name,
            ready=bool(st and st.ready),
            weight_a=w.a,
            weight_b=w.b,
            weight_g=w.g,
            weight_updates=w.updates,
            kv_cache_usage=st.kv_cache_usage if st else 0.0,
            load=self.controller.smoothed,
            draining=self.draining,
        )

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no session is in flight (or ``timeout_s``); True if drained."""
        if self.active == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            log.warning("%d session(s) still running after the %.1f s grace", self.active, timeout_s)
            return False

    def close(self) -> None:
        self.metrics.close()

    def _check_request(self, req: t.OpenRequest) -> tuple:
        """The request's own validity: parsing the problem, compiling its rules (a client's JSON Schema
        and patterns). Pure, and run in a worker thread: client data never holds the event loop."""
        lim = self.cfg.limits
        task = get_task(req.task)
        check_request_id(req.request_id)
        check_draft_model(req.draft_model)
        where = check_question(req.prompt, req.messages, lim.max_prompt_chars, "problem.")
        try:
            spec = task.parse_problem(req.question)
        except (ValueError, RecursionError):  # a parser on hostile text (a 5,000-digit number): the request's
            raise InvalidArgument(f"{where}: cannot be parsed (a number or nesting beyond any limit)") from None
        rules = RuleSet(req.rules, task, spec, extraction=req.extraction)
        if req.refine is not None:
            # a longer budget than the policy's is clamped to it in the session, not refused
            req.refine.validate("refine", max(MAX_NEW_TOKENS, self.cfg.policy.refine_max_tokens))
        if req.expected_drafts > lim.max_drafts:
            raise ResourceExhausted(f"expected_drafts: {req.expected_drafts} > limit {lim.max_drafts}")
        check_deadline(req.deadline_ms, lim.max_deadline_ms)
        return task, spec, rules

    def _admit(self, edge: str = "") -> None:
        """Whether this replica takes a session now (on the loop: it reads the counters it updates)."""
        lim = self.cfg.limits
        if self.draining:
            raise Unavailable("server: draining for shutdown; retry on another replica")
        if self.engine is None or not self.engine.stats().ready:
            raise Unavailable("engine: not ready (loading or restarting); retry shortly")
        if self.active >= lim.max_sessions:
            raise ResourceExhausted(
                f"sessions: {self.active} active, limit {lim.max_sessions}", reason=Reason.SESSIONS_FULL
            )
        if lim.max_sessions_per_edge and self.per_edge[edge] >= lim.max_sessions_per_edge:
            raise ResourceExhausted(
                f"sessions: {self.per_edge[edge]} active for this edge, limit {lim.max_sessions_per_edge} per edge",
                reason=Reason.SESSIONS_FULL,
            )

    async def session(
        self, req: t.OpenRequest, inbox: AsyncIterator[EdgeItem], edge: str = "", drafting: bool = True
    ) -> AsyncIterator[t.CloudEvent]:
        """Run one session for caller ``edge``; raises CoinferError subclasses for bad input / limits.
        ``drafting``: drafts may come (False: ``generate``)."""
        task, spec, rules = await run_sized(request_check_size(req), self._check_request, req)
        self._admit(edge)
        req.request_id = req.request_id or uuid.uuid4().hex[:16]
        deadline_ms = req.deadline_ms or self.cfg.policy.default_deadline_ms
        w = self.learner.weights
        cost = metered()  # before the session starts tasks: they count into it too
        s = Session(
            cfg=self.cfg,
            engine=self.engine,
            req=req,
            task=task,
            spec=spec,
            rules=rules,
            recommended_drafts=self.controller.recommended,
            deadline_s=deadline_ms / 1e3,
            weights=(w.a, w.b, w.g),
            load=self.controller.smoothed,
            round_odds=self.round_odds,
            drafting=drafting,
        )
        self.active += 1
        self.per_edge[edge] += 1
        self._idle.clear()
        self.metrics.active.inc()
        t0 = time.perf_counter()
        outcome, chunks = "error", [0]
        try:
            async for ev in s.run(inbox):
                if isinstance(ev, t.Summary):  # the engine work so far: every request the answer needed
                    ev.cost = dataclasses.replace(cost)
                self.metrics.observe(ev, chunks)
                yield ev
            outcome = "ok"
            if s.outcome and self.learner.record(s.outcome):
                await self.learner.update()  # the fit and the shared file: in a worker thread
                self._publish_weights()
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.active -= 1
            self.per_edge[edge] -= 1
            if not self.per_edge[edge]:
                del self.per_edge[edge]
            if self.active == 0:
                self._idle.set()
            self.metrics.active.dec()
            self.metrics.sessions.labels(outcome).inc()
            log.info(
                "session %s from %s %s in %.0f ms",
                logs.quoted(req.request_id),
                edge or "?",
                outcome,
                (time.perf_counter() - t0) * 1e3,
            )

    async def generate(self, req: t.OpenRequest, edge: str = "") -> AsyncIterator[t.CloudEvent]:
        """Cloud-only: a session with no drafts (the cloud drafts itself at once)."""

        async def no_drafts() -> AsyncIterator[EdgeItem]:
            return
            yield  # pragma: no cover - makes this an async generator

        async for ev in self.session(req, no_drafts(), edge, drafting=False):
            if not isinstance(ev, t.SessionAccepted):
                yield ev
