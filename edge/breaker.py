"""Circuit breaker towards the cloud: stop hammering a dead cloud, probe it back in.

closed    -> requests go to the cloud; ``failures`` consecutive failures (or the health
             watch seeing NOT_SERVING / losing the stream) open the circuit.
open      -> requests skip the cloud and are answered locally at once; after ``reset_s``
             one request is let through (half_open).
half_open -> one trial request; success (or the health watch seeing SERVING) closes the
             circuit, failure opens it for another ``reset_s``.
Pure logic with an injectable clock; no I/O. It keeps no history (a daemon's breaker flips for
weeks): the last move's reason, and ``on_change`` for whoever counts or logs moves (the edge's
metrics and log, ``edge/service.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from coinfer.types import BreakerState


@dataclass(kw_only=True)
class CircuitBreaker:
    failures: int = 3
    reset_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    state: BreakerState = BreakerState.CLOSED
    _fails: int = 0
    _opened_at: float = 0.0
    _trial: bool = False
    _trial_at: float = 0.0
    why: str = ""
    """Why the breaker last changed state (status and tests; bounded: no history kept)."""
    on_change: Callable[[BreakerState, str], None] | None = None
    """Told each change of state, with its reason."""

    def _to(self, state: BreakerState, why: str) -> None:
        if state != self.state:
            self.state, self.why = state, why
            if self.on_change is not None:
                self.on_change(state, why)
        if state is BreakerState.OPEN:
            self._opened_at = self.clock()
            self._trial = False

    def would_allow(self) -> bool:
        """Would ``allow()`` let a request through now? Asked without taking the half-open trial:
        auto's planner asks before it knows whether its plan uses the cloud at all."""
        if self.state is BreakerState.OPEN:
            return self.clock() - self._opened_at >= self.reset_s
        if self.state is BreakerState.HALF_OPEN:
            # one trial at a time (a trial that never reported is replaced after reset_s)
            return not self._trial or self.clock() - self._trial_at >= self.reset_s
        return True

    def allow(self) -> bool:
        """May this request use the cloud? A yes while not closed takes the half-open trial."""
        if not self.would_allow():
            return False
        if self.state is BreakerState.OPEN:
            self._to(BreakerState.HALF_OPEN, "reset timeout")
        if self.state is BreakerState.HALF_OPEN:
            self._trial, self._trial_at = True, self.clock()
        return True

    def success(self) -> None:
        self._fails = 0
        self._to(BreakerState.CLOSED, "request succeeded")

    def failure(self, why: str = "request failed") -> None:
        self._fails += 1
        if self.state is BreakerState.HALF_OPEN or self._fails >= self.failures:
            self._to(BreakerState.OPEN, why)

    def health(self, serving: bool) -> None:
        """The health watch's view: NOT_SERVING opens at once; SERVING closes."""
        if serving:
            if self.state is not BreakerState.CLOSED:
                self._fails = 0
                self._to(BreakerState.CLOSED, "health: SERVING")
        else:
            self._to(BreakerState.OPEN, "health: NOT_SERVING")
