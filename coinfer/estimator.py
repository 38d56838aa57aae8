"""One time-decayed estimate of a quantity: its mean, its spread and how much evidence it rests on.

Pure and typed (no I/O, no clock of its own: the caller passes ``now``, seconds on a monotonic clock).
The edge planner keeps one per measured quantity (``coinfer.edge.planner.estimates``), the cloud one per
kind of round of drafts (``coinfer.cloud.policy.RoundOdds``): one estimator, so that staleness, sample
counts and uncertainty mean the same everywhere.

A sample taken ``age`` seconds ago counts with weight ``w = exp(-age / tau)`` (a fresh one: 1)::

    W    = sum w_i                       evidence, in fresh samples: an estimate not fed for tau keeps e^-1 of it
    W2   = sum w_i^2
    mean = sum w_i x_i / W               the weighted mean (aging leaves it where it is)
    M2   = sum w_i (x_i - mean)^2
    n    = W^2 / W2                      Kish's effective sample size: how many equal samples the spread rests
                                         on (aging leaves it too; a fresh sample beside a faded one adds ~1)
    var  = M2 / W * n / (n - 1)          the spread of one sample, unbiased for reliability weights;
                                         unknown at n = 1 (one sample has no spread)
    se   = sqrt(var / W)                 the standard error of the mean: it grows as the estimate ages

Nothing is ever reset: an estimate left alone fades (``W`` shrinks, ``se`` grows) and the next sample
outweighs it by as much as it has faded. Samples in {0, 1} (a rule-valid answer, a round holding a valid
draft) are read as a Beta posterior from a uniform prior (``beta``): ``W * mean`` hits in ``W`` trials.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, kw_only=True)
class Decayed:
    """The state of one estimate at clock time ``at`` (the time of its newest sample, or of ``aged``)."""

    mean: float = 0.0
    weight: float = 0.0
    """``W``: the samples' summed weights at ``at``."""
    sq_weight: float = 0.0
    """``W2``: their squares' sum (for ``n``)."""
    m2: float = 0.0
    """``M2``: the weighted sum of squared deviations from ``mean``."""
    at: float = 0.0

    def aged(self, now: float, tau_s: float) -> Decayed:
        """This estimate as it stands at ``now``: every weight times ``exp(-(now - at) / tau_s)``. A clock
        that reads earlier than ``at`` (a state loaded from another process) ages it by nothing."""
        if now <= self.at:
            return self
        f = math.exp(-(now - self.at) / tau_s)
        return Decayed(mean=self.mean, weight=self.weight * f, sq_weight=self.sq_weight * f * f, m2=self.m2 * f, at=now)

    def add(self, x: float, now: float, tau_s: float) -> Decayed:
        """Fold in sample ``x`` taken at ``now`` (West's weighted update, the new sample at weight 1)."""
        a = self.aged(now, tau_s)
        weight = a.weight + 1.0
        delta = x - a.mean
        mean = a.mean + delta / weight
        m2 = max(0.0, a.m2 + delta * (x - mean))  # rounding must not make a spread negative
        return Decayed(mean=mean, weight=weight, sq_weight=a.sq_weight + 1.0, m2=m2, at=max(now, self.at))

    @property
    def n(self) -> float:
        """Kish's effective sample size ``W^2 / W2`` (0 with no evidence left)."""
        return self.weight * self.weight / self.sq_weight if self.sq_weight > 0 else 0.0

    @property
    def variance(self) -> float | None:
        """The spread of one sample (``var``); None while it rests on one sample's worth (``n`` <= 1)."""
        n = self.n
        if self.weight <= 0 or n <= 1.0 + 1e-9:
            return None
        return self.m2 / self.weight * n / (n - 1.0)

    @property
    def stderr(self) -> float | None:
        """The standard error of the mean (``se``); None while the spread is unknown."""
        var = self.variance
        return None if var is None else math.sqrt(var / self.weight)

    @property
    def beta(self) -> tuple[float, float]:
        """For samples in {0, 1}: the Beta posterior ``(1 + hits, 1 + misses)`` from a uniform prior, hits and
        misses in fresh samples' weight. With no evidence: (1, 1), every rate equally likely."""
        hits = min(self.weight, max(0.0, self.weight * self.mean))
        return 1.0 + hits, 1.0 + self.weight - hits


def beta_mean_sd(a: float, b: float) -> tuple[float, float]:
    """The mean and standard deviation of a Beta(a, b)."""
    s = a + b
    return a / s, math.sqrt(a * b / (s * s * (s + 1.0)))


class DecayedTable(Generic[K]):
    """Decayed estimates by key, on one clock and one ``tau_s``; with ``max_keys``, least recently used keys
    are dropped past that many (a key chosen by clients must not grow a table without bound)."""

    def __init__(self, *, tau_s: float, clock: Callable[[], float], max_keys: int | None = None) -> None:
        if not tau_s > 0:
            raise ValueError(f"tau_s: must be > 0, got {tau_s!r}")
        if max_keys is not None and max_keys < 1:
            raise ValueError(f"max_keys: must be >= 1, got {max_keys!r}")
        self.tau_s, self.clock, self.max_keys = tau_s, clock, max_keys
        self._states: OrderedDict[K, Decayed] = OrderedDict()
        """Each key's state as of its newest sample (aged on reading)."""

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._states))

    def add(self, key: K, x: float) -> Decayed:
        """Fold sample ``x`` into ``key``'s estimate, now; returns the new state."""
        state = self._states.get(key, Decayed()).add(x, self.clock(), self.tau_s)
        self._put(key, state)
        return state

    def restart(self, key: K, x: float) -> Decayed:
        """``key``'s estimate is the reading ``x`` alone, now (a probe of the conditions of this moment)."""
        state = Decayed().add(x, self.clock(), self.tau_s)
        self._put(key, state)
        return state

    def get(self, key: K) -> Decayed | None:
        """``key``'s estimate as it stands now (None: never measured); a read counts as a use."""
        state = self._states.get(key)
        if state is None:
            return None
        self._states.move_to_end(key)
        return state.aged(self.clock(), self.tau_s)

    def age_s(self, key: K) -> float:
        """Seconds since ``key``'s newest sample (inf: never measured)."""
        state = self._states.get(key)
        return math.inf if state is None else max(0.0, self.clock() - state.at)

    def stored(self) -> dict[K, Decayed]:
        """Every state as of its newest sample (for a state file: ``at`` on this process's clock)."""
        return dict(self._states)

    def load(self, key: K, state: Decayed) -> None:
        """Put ``state`` under ``key`` as it stands (a state file's, its ``at`` on this process's clock)."""
        self._put(key, state)

    def _put(self, key: K, state: Decayed) -> None:
        self._states[key] = state
        self._states.move_to_end(key)
        if self.max_keys is not None:
            while len(self._states) > self.max_keys:
                self._states.popitem(last=False)


def with_age(state: Decayed, age_s: float, now: float) -> Decayed:
    """``state`` re-timed so that its newest sample is ``age_s`` old at ``now`` (loading a state file)."""
    return dataclasses.replace(state, at=now - max(0.0, age_s))
