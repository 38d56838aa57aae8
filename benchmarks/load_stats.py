"""The load ladder's arithmetic, apart from any server: Poisson arrivals, one measured rate (``Step``),
the capacity at an SLO and the output contract's entry of one system (``benchmarks.capacity``)."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field

GRID_POINTS_PER_DECADE = 24
"""The one absolute rate grid every system's ladder steps on, in every run: ``10 ** (k / 24)`` requests/s, each
point 10% above the last (issue 53). Two systems' capacities are then compared at the same offered rates, and a
capacity bracketed by neighbouring points is known to +-5% around their middle."""

WORK_KEYS = ("engine_requests", "prompt_tokens", "cached_tokens", "scored_tokens", "decoded_tokens", "steps")
"""The engine's work for one answer, as its server counts it (``coinfer.types.CloudCost``'s names): requests; prompt
positions, of which read from the prefix cache, and of the computed ones those prefilled to score a text; tokens
decoded; sequential engine steps (a prefill, then one per decoded token of the longest sample)."""


def grid_rate(k: int) -> float:
    """The grid's ``k``-th rate (requests/s), to the 3 decimals a ``Step`` keeps."""
    return round(10 ** (k / GRID_POINTS_PER_DECADE), 3)


def grid_index(rate: float, up: bool = False) -> int:
    """The grid point nearest ``rate`` (``up``: the lowest at or above it)."""
    x = GRID_POINTS_PER_DECADE * math.log10(rate)
    return math.ceil(x - 1e-9) if up else round(x)


def work_tokens(work: dict | None) -> int | None:
    """Tokens the engine computed for one answer's ``work``: its prompt past the prefix cache, plus its decoding
    (``coinfer.types.CloudCost.work_tokens``); None where there is no count."""
    if work is None:
        return None
    return work["prompt_tokens"] - work.get("cached_tokens", 0) + work["decoded_tokens"]


def work_means(works: list[dict]) -> dict:
    """Per ``WORK_KEYS`` key, its mean over the answers whose server counted it (absent where none did)."""
    out = {}
    for key in WORK_KEYS:
        got = [w[key] for w in works if w.get(key) is not None]
        if got:
            out[key] = round(sum(got) / len(got), 2)
    return out


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank); 0.0 for no values."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Poisson arrival offsets (s) in ``[0, duration_s)`` at ``rate`` per second; at least one."""
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out or [0.0]


@dataclass
class Step:
    """One rate of the ladder, measured."""

    rate: float
    answers: int
    failed: int
    wall_s: float
    cpu_s: float
    p50_s: float
    p95_s: float
    ttft_p50_s: float
    accuracy: float | None
    sources: dict = field(default_factory=dict)
    engine_tokens_per_answer: float | None = None
    """Mean of ``work_tokens`` of the servers' own counts (``Result.engine_tokens``) over answers that have one."""
    work_per_answer: dict = field(default_factory=dict)
    """``work_means`` of the answers' counted work (``WORK_KEYS``)."""
    edge_only_share: float = 0.0
    """Share of the answers the edge gave alone (no cloud session)."""
    cpu_s_per_answer_by_process: dict = field(default_factory=dict)
    """The replica's CPU-s per answer by process name (the saturated run's middle half): the API server's
    Python (sessions, rules, gRPC or HTTP) apart from vLLM's engine core."""

    def held(self, slo_s: float) -> bool:
        return self.failed == 0 and self.answers > 0 and self.p95_s <= slo_s

    @property
    def cpu_per_answer(self) -> float:
        return self.cpu_s / max(1, self.answers)


def capacity(steps: list[Step], slo_s: float) -> Step | None:
    """The highest-rate step that held the SLO (None: not even the first)."""
    held = [s for s in steps if s.held(slo_s)]
    return max(held, key=lambda s: s.rate) if held else None


def summary(steps: list[Step], slo_s: float, sat: Step) -> dict:
    """The output contract's entry of one system on one workload: the capacity step's latency and accuracy,
    the saturated run's cost (``cloud_cpu_s_per_answer``) and throughput."""
    best = capacity(steps, slo_s)
    at = best if best is not None else (steps[0] if steps else sat)
    return {
        "capacity_rps": round(best.rate, 3) if best is not None else 0.0,
        # the cloud's share of it: the answers the edge gave alone are no cloud capacity
        "cloud_capacity_rps": round(best.rate * (1 - best.edge_only_share), 3) if best is not None else 0.0,
        "edge_only_share": at.edge_only_share,
        # no higher rate was tried and missed: the replica may hold more (the ladder ran out of steps)
        "capacity_lower_bound": best is not None and not any(s.rate > best.rate for s in steps),
        "cloud_cpu_s_per_answer": round(sat.cpu_per_answer, 4),
        "engine_tokens_per_answer": sat.engine_tokens_per_answer,
        "work_per_answer": sat.work_per_answer,
        "accuracy": at.accuracy,
        "p50_s": at.p50_s,
        "p95_s": at.p95_s,
        "ttft_p50_s": at.ttft_p50_s,
        "saturated_answers_per_s": round(sat.answers / max(sat.wall_s, 1e-9), 3),
        "saturated_accuracy": sat.accuracy,
        "sources": at.sources,
        "saturated": dataclasses.asdict(sat),
        "steps": [dataclasses.asdict(s) for s in steps],
    }
