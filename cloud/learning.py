"""Online learning of the scheduler weights a, b, g from session outcomes (docs/design.md §3.1).

Every ranked draft of a finished session becomes one outcome row: its verifier
score, the session's agreement term (1 - std of scores), its verification
latency, and a label — 1 if the draft is right (graded by the task where it can
grade, else: it agrees with the final answer). Every ``every`` sessions the
weights are refitted on the rows since the last update (``policy.fit_weights``)
and blended in with an EWMA, then written to ``path`` (atomically) so a restart
continues where it stopped. ``record`` (on the event loop) only counts; the refit
and the file (numpy, an ``flock`` that may wait for another replica, the disk) run
in a worker thread (``update``), one at a time.

Replicas may share one state file (a volume every pod mounts): the weights are then merged, not
overwritten. Each update takes an exclusive lock on ``<path>.lock``, re-reads the file (the other
replicas' updates), blends its own fit into *those* weights and writes them back before releasing
the lock: every replica's fit is applied exactly once, in some order, and none is lost. Per-replica
files would also avoid lost updates, but each replica would then learn from 1/N of the traffic and a
rolling update (new pod names) would start from scratch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from coinfer.cloud.policy import fit_weights
from coinfer.cloud.ranking import MS_PER_S, Ranked
from coinfer.rules import RuleSet
from coinfer.serving import statefile
from coinfer.tasks import Task

log = logging.getLogger(__name__)

Outcome = tuple[float, float, float, float]
"""One ranked draft's outcome: (verifier score, agreement, verification latency in s, label 1/0)."""


def outcome_rows(ranked: Ranked, answer: str, task: Task, spec: dict, rules: RuleSet) -> list[Outcome]:
    """A finished session's ranked drafts as outcome rows, each labelled right (1) or wrong (0): graded
    by the task where it can grade, else by whether it agrees with the answer the session gave."""
    final_key = task.answer_key(rules.parse(answer))
    rows = []
    for j, _, agree in ranked:
        try:
            label = float(task.grade(spec, j.parsed))
        except Exception:  # noqa: BLE001 - a task that cannot grade: agreement with the answer
            label = float(task.answer_key(j.parsed) == final_key)
        rows.append((j.verdict.score, agree, j.verdict.verify_ms / MS_PER_S, label))
    return rows


class _WeightsSchema(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, strict=True)
    a: float = Field(ge=0)
    b: float = Field(ge=0)
    g: float = Field(ge=0)
    updates: int = Field(0, ge=0)
    sessions: int = Field(0, ge=0)


class StateFile(BaseModel):
    """The state file's schema (``statefile.load``): finite, non-negative weights and counts."""

    weights: _WeightsSchema


@dataclass(kw_only=True)
class Weights:
    a: float
    b: float
    g: float
    updates: int = 0
    sessions: int = 0


@dataclass(kw_only=True)
class WeightLearner:
    weights: Weights
    every: int = 100
    alpha: float = 0.3
    """EWMA weight of a new fit."""
    path: Path | None = None
    rows: list[Outcome] = field(default_factory=list)
    _pending: int = 0
    """Sessions recorded here since this replica's last update."""
    _written_sessions: int = 0
    """``weights.sessions`` as last read from or written to the shared file."""
    _updating: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    """One update at a time: each merges into what the last one wrote."""

    @classmethod
    def open(cls, a: float, b: float, g: float, *, every: int, alpha: float, path: str) -> WeightLearner:
        w = Weights(a=a, b=b, g=g)
        p = Path(path) if path else None
        saved = statefile.load(p, StateFile)  # an invalid file is set aside: it must not stop the service
        if saved is not None:
            w = Weights(**saved.weights.model_dump())
            log.info("scheduler weights from %s: a=%.3f b=%.3f g=%.3f (%d updates)", p, w.a, w.b, w.g, w.updates)
        return cls(weights=w, every=every, alpha=alpha, path=p, _written_sessions=w.sessions)

    def record(self, rows: list[Outcome]) -> bool:
        """Add one session's outcome rows (on the event loop: no I/O, no fit); True when this session makes
        an update due (``update``). With learning off (``every`` 0) nothing is kept."""
        if not self.every:
            return False
        self.rows.extend(rows)
        self.weights.sessions += 1
        self._pending += 1
        if self._pending < self.every:  # this replica's sessions: the shared count moves with the others'
            return False
        self._pending = 0
        return True

    async def update(self) -> None:
        """Refit on the rows since the last update and merge into the shared file, in a worker thread: the fit
        is numpy, and the file's lock may wait for another replica's update. The weights change on the loop,
        at once, when it is done; sessions recorded meanwhile are kept on top."""
        async with self._updating:
            rows, self.rows = self.rows, []
            base = dataclasses.replace(self.weights)
            new = await asyncio.to_thread(self._updated, rows, base, self._written_sessions)
            meanwhile = self.weights.sessions - base.sessions
            self._written_sessions = new.sessions
            new.sessions += meanwhile
            self.weights = new

    def _updated(self, rows: list[Outcome], mine: Weights, written: int) -> Weights:
        """``mine`` (sessions counted here since ``written`` included) with a fit on ``rows`` blended into the
        shared file's weights, and written back under the lock. Blocking: a worker thread's."""
        fit = fit_weights(rows, total=mine.a + mine.b + mine.g)
        with self._locked():
            w = self._merged(mine, written)  # other replicas' updates since ours
            if fit is None:
                log.info("scheduler weights kept: outcomes since the last update cannot separate the terms")
            else:
                k = self.alpha
                w.a, w.b, w.g = ((1 - k) * old + k * new for old, new in zip((w.a, w.b, w.g), fit))
                w.updates += 1
                log.info("scheduler weights updated: a=%.3f b=%.3f g=%.3f", w.a, w.b, w.g)
            self._write(w)
        return w

    @contextmanager
    def _locked(self):
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f"{self.path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def _merged(self, mine: Weights, written: int) -> Weights:
        """The shared file's weights, with the sessions counted here since ``written`` (the file's count when
        this replica last read or wrote it) added; ``mine`` where there is no valid file."""
        saved = statefile.load(self.path, StateFile)  # invalid: set aside, this replica's weights win
        if saved is None:
            return dataclasses.replace(mine)
        shared = Weights(**saved.weights.model_dump())
        shared.sessions += mine.sessions - written
        return shared

    def _write(self, w: Weights) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"weights": asdict(w)}, indent=2))
        os.replace(tmp, self.path)
