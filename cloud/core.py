"""The cloud's work behind the servicer: admission, sessions, cloud-only generation, status.

Transport-free: takes and returns domain types, raises ``coinfer.errors``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator

from cloud.config import CloudConfig
from cloud.engine import TargetEngine
from cloud.load import DraftCountController
from cloud.session import EdgeItem, Session
from coinfer import types as t
from coinfer.errors import InvalidArgument, ResourceExhausted, require
from coinfer.rules import RuleSet
from coinfer.tasks import get_task

log = logging.getLogger(__name__)


class CloudCore:
    """Owns the engine handle, the admission limits and the load controller."""

    def __init__(self, cfg: CloudConfig, engine: TargetEngine | None = None) -> None:
        self.cfg = cfg
        self.engine = engine
        self.active = 0
        self.controller = DraftCountController()

    def status(self) -> t.Status:
        st = self.engine.stats() if self.engine else None
        util = (st.running / st.max_num_seqs) if st else 0.0
        return t.Status(
            # vLLM runs max_num_seqs at once and queues the rest
            queue_depth=max(0, st.running - st.max_num_seqs) if st else 0, running=st.running if st else 0,
            utilisation=min(1.0, util),
            recommended_drafts=self.controller.update(util), active_sessions=self.active,
            model=self.cfg.engine.model, ready=bool(st and st.ready),
        )

    def _admit(self, req: t.OpenRequest) -> tuple:
        lim = self.cfg.limits
        task = get_task(req.task)
        require(req.prompt.strip() != "", "problem.prompt", "required")
        if len(req.prompt) > lim.max_prompt_chars:
            raise ResourceExhausted(f"problem.prompt: {len(req.prompt)} chars > limit {lim.max_prompt_chars}")
        spec = task.parse_problem(req.prompt)
        rules = RuleSet(req.rules, task, spec)
        if req.refine is not None:
            req.refine.validate("refine", self.cfg.policy.refine_max_tokens)
        if req.expected_drafts > lim.max_drafts:
            raise ResourceExhausted(f"expected_drafts: {req.expected_drafts} > limit {lim.max_drafts}")
        if not 0 <= req.deadline_ms <= lim.max_deadline_ms:
            raise InvalidArgument(f"deadline_ms: must be in 0..{lim.max_deadline_ms}, got {req.deadline_ms}")
        if len(req.request_id) > 128:
            raise InvalidArgument(f"request_id: {len(req.request_id)} chars > 128")
        if self.active >= lim.max_sessions:
            raise ResourceExhausted(f"sessions: {self.active} active, limit {lim.max_sessions}")
        return task, spec, rules

    async def session(self, req: t.OpenRequest, inbox: AsyncIterator[EdgeItem]) -> AsyncIterator[t.CloudEvent]:
        """Run one session; raises CoinferError subclasses for bad input / limits."""
        task, spec, rules = self._admit(req)
        req.request_id = req.request_id or uuid.uuid4().hex[:16]
        deadline_ms = req.deadline_ms or self.cfg.policy.default_deadline_ms
        s = Session(self.cfg, self.engine, req, task, spec, rules, self.status().recommended_drafts, deadline_ms / 1e3)
        self.active += 1
        t0 = time.perf_counter()
        try:
            async for ev in s.run(inbox):
                yield ev
        finally:
            self.active -= 1
            log.info("session %s done in %.0f ms", req.request_id, (time.perf_counter() - t0) * 1e3)

    async def generate(self, req: t.OpenRequest) -> AsyncIterator[t.CloudEvent]:
        """Cloud-only: a session with no drafts (the cloud drafts itself at once)."""

        async def no_drafts() -> AsyncIterator[EdgeItem]:
            return
            yield  # pragma: no cover - makes this an async generator

        async for ev in self.session(req, no_drafts()):
            if not isinstance(ev, t.SessionAccepted):
                yield ev
