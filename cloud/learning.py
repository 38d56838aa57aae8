"""Online learning of the scheduler weights a, b, g from session outcomes (seed 003, 3.1).

Every ranked draft of a finished session becomes one outcome row: its verifier
score, the session's agreement term (1 - std of scores), its verification
latency, and a label — 1 if the draft is right (graded by the task where it can
grade, else: it agrees with the final answer). Every ``every`` sessions the
weights are refitted on the rows since the last update (``policy.fit_weights``)
and blended in with an EWMA, then written to ``path`` (atomically) so a restart
continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cloud.policy import fit_weights

log = logging.getLogger(__name__)


@dataclass
class Weights:
    a: float
    b: float
    g: float
    updates: int = 0
    sessions: int = 0


@dataclass
class WeightLearner:
    weights: Weights
    every: int = 100
    alpha: float = 0.3
    """EWMA weight of a new fit."""
    path: Path | None = None
    rows: list[tuple[float, float, float, float]] = field(default_factory=list)

    @classmethod
    def open(cls, a: float, b: float, g: float, every: int, alpha: float, path: str) -> WeightLearner:
        w = Weights(a, b, g)
        p = Path(path) if path else None
        if p is not None and p.is_file():
            try:
                w = Weights(**json.loads(p.read_text())["weights"])
                log.info("scheduler weights from %s: a=%.3f b=%.3f g=%.3f (%d updates)", p, w.a, w.b, w.g, w.updates)
            except (ValueError, KeyError, TypeError) as exc:  # a corrupt state file must not stop the service
                log.error("%s: unreadable state (%s); starting from the configured weights", p, exc)
        return cls(w, every, alpha, p)

    def record(self, rows: list[tuple[float, float, float, float]]) -> bool:
        """Add one session's outcome rows; returns True when this session triggered an update.
        With learning off (``every`` 0) nothing is kept."""
        if not self.every:
            return False
        self.rows.extend(rows)
        self.weights.sessions += 1
        if self.weights.sessions % self.every:
            return False
        self.update()
        return True

    def update(self) -> None:
        w = self.weights
        fit = fit_weights(self.rows, total=w.a + w.b + w.g)
        self.rows.clear()
        if fit is None:
            log.info("scheduler weights kept: outcomes since the last update cannot separate the terms")
        else:
            k = self.alpha
            w.a, w.b, w.g = ((1 - k) * old + k * new for old, new in zip((w.a, w.b, w.g), fit))
            w.updates += 1
            log.info("scheduler weights updated: a=%.3f b=%.3f g=%.3f", w.a, w.b, w.g)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"weights": asdict(self.weights)}, indent=2))
        os.replace(tmp, self.path)
