"""Load -> recommended draft count (docs/design.md §3.3), smoothed so it does not oscillate.

Utilisation u in [0, 1] (engine slots in use, or GPU utilisation on a GPU) is
smoothed with an EWMA; the policy maps it to a draft count: light load (< 0.6)
3 drafts, medium (0.6-0.85) 5 — spare capacity buys accuracy —, heavy (>= 0.85)
back to 3 to protect latency. A band of ``hysteresis`` around each threshold
keeps the count from flapping when the load hovers at a boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE_BELOW = 1e-6
"""A smoothed utilisation under this is 0: no request in flight for ~40 samples."""


@dataclass(kw_only=True)
class DraftCountController:
    light: int = 3
    medium: int = 5
    heavy: int = 3
    medium_at: float = 0.6
    heavy_at: float = 0.85
    alpha: float = 0.3
    """EWMA weight of a new sample."""
    hysteresis: float = 0.05
    smoothed: float = 0.0
    level: int = 0  # 0 light, 1 medium, 2 heavy

    def update(self, utilisation: float) -> int:
        u = min(1.0, max(0.0, utilisation))
        self.smoothed += self.alpha * (u - self.smoothed)
        if self.smoothed < IDLE_BELOW:  # an idle replica's EWMA decays without end: 1e-45 reached Status and /healthz
            self.smoothed = 0.0
        up = (self.medium_at, self.heavy_at)
        s, h = self.smoothed, self.hysteresis
        while self.level < 2 and s >= up[self.level] + h:
            self.level += 1
        while self.level > 0 and s < up[self.level - 1] - h:
            self.level -= 1
        return self.recommended

    @property
    def recommended(self) -> int:
        return (self.light, self.medium, self.heavy)[self.level]
