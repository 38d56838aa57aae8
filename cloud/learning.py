"""Online learning of the scheduler weights a, b, g from session outcomes (docs/design.md §3.1).

Every ranked draft of a finished session becomes one outcome row: its verifier
score, the session's agreement term (1 - std of scores), its verification
latency, and a label — 1 if the draft is right (graded by the task where it can
grade, else: it agrees with the final answer). Every ``every`` sessions the
weights are refitted on the rows since the last update (``policy.fit_weights``)
and blended in with an EWMA, then written to ``path`` (atomically) so a restart
continues where it stopped.

Replicas may share one state file (a volume every pod mounts): the weights are then merged, not
overwritten. Each update takes an exclusive lock on ``<path>.lock``, re-reads the file (the other
replicas' updates), blends its own fit into *those* weights and writes them back before releasing
the lock: every replica's fit is applied exactly once, in some order, and none is lost. Per-replica
files would also avoid lost updates, but each replica would then learn from 1/N of the traffic and a
rolling update (new pod names) would start from scratch.
"""

from __future__ import annotations

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
        """Add one session's outcome rows; returns True when this session triggered an update.
        With learning off (``every`` 0) nothing is kept."""
        if not self.every:
            return False
        self.rows.extend(rows)
        self.weights.sessions += 1
        self._pending += 1
        if self._pending < self.every:  # this replica's sessions: the shared count moves with the others'
            return False
        self._pending = 0
        self.update()
        return True

    def update(self) -> None:
        fit = fit_weights(self.rows, total=self.weights.a + self.weights.b + self.weights.g)
        self.rows.clear()
        with self._locked():
            self._merge()  # other replicas' updates since ours
            w = self.weights
            if fit is None:
                log.info("scheduler weights kept: outcomes since the last update cannot separate the terms")
            else:
                k = self.alpha
                w.a, w.b, w.g = ((1 - k) * old + k * new for old, new in zip((w.a, w.b, w.g), fit))
                w.updates += 1
                log.info("scheduler weights updated: a=%.3f b=%.3f g=%.3f", w.a, w.b, w.g)
            self._write()

    @contextmanager
    def _locked(self):
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f"{self.path.name}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def _merge(self) -> None:
        """Adopt the shared file's weights; sessions counted here since our last write are added."""
        saved = statefile.load(self.path, StateFile)  # invalid: set aside, this replica's weights win
        if saved is None:
            return
        shared = Weights(**saved.weights.model_dump())
        mine = self.weights.sessions - self._written_sessions
        shared.sessions += mine
        self.weights = shared

    def save(self) -> None:
        with self._locked():
            self._merge()
            self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"weights": asdict(self.weights)}, indent=2))
        os.replace(tmp, self.path)
        self._written_sessions = self.weights.sessions
