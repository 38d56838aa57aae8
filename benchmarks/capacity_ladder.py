"""The load generator of ``benchmarks.capacity``: one request as every system sends it, and the measurements of one
system on one workload (the unloaded pass, the saturated run, the ladder of open-loop Poisson rates and the capacity
it shows). No servers are started here: a system is an ``Ask`` and the replica's ``Server`` (its CPU time)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.load_stats import Step, arrivals, pct, summary
from benchmarks.replica import Server

# ---- one request, per kind of system ------------------------------------------------------------------


@dataclass
class Request:
    """One workload request as every system sends it."""

    messages: list[dict]
    case: object | None  # benchmarks.open_accuracy.Case (graded); None: an open prompt (not graded)
    max_tokens: int

    def grade(self, text: str) -> bool | None:
        return None if self.case is None else self.case.grade(text)


@dataclass
class Result:
    ok: bool | None
    latency_s: float
    ttft_s: float
    failed: str = ""
    source: str = ""
    engine_tokens: int | None = None
    """Tokens the target engine computed for the answer, as its server reports them: coinfer's
    ``Summary.cost`` (prefill past the prefix cache + decoding), vLLM's usage (prompt + completion)."""


# ---- the ladder ----------------------------------------------------------------------------------------

Ask = Callable[[Request, str], "asyncio.Future[Result]"]


async def run_step(
    ask: Ask, reqs: list[Request], rate: float, step_s: float, server: Server, rng: random.Random, tag: str
) -> Step:
    """Poisson arrivals at ``rate`` for ``step_s`` seconds (requests in turn from ``reqs``), drained."""
    offsets = arrivals(rate, step_s, rng)
    t0 = time.perf_counter()
    cpu0 = server.cpu_s()

    async def one(i: int, at: float) -> Result:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        try:
            return await ask(reqs[i % len(reqs)], f"{tag}-{i}")
        except Exception as exc:  # noqa: BLE001 - a failed request is what this measures
            return Result(None, time.perf_counter() - t0 - at, 0.0, failed=f"{type(exc).__name__}: {exc}"[:160])

    results = await asyncio.gather(*(one(i, at) for i, at in enumerate(offsets)))
    return _step(rate, results, time.perf_counter() - t0, server.cpu_s() - cpu0)


def _step(rate: float, results: list[Result], wall: float, cpu: float) -> Step:
    good = [r for r in results if not r.failed]
    graded = [r.ok for r in good if r.ok is not None]
    return Step(
        rate=round(rate, 3),
        answers=len(good),
        failed=len(results) - len(good),
        wall_s=round(wall, 2),
        cpu_s=round(cpu, 3),
        p50_s=round(pct([r.latency_s for r in good], 0.5), 3),
        p95_s=round(pct([r.latency_s for r in results], 0.95), 3),
        ttft_p50_s=round(pct([r.ttft_s for r in good], 0.5), 3),
        accuracy=round(sum(graded) / len(graded), 3) if graded else None,
        sources=dict(Counter(r.source if not r.failed else r.failed for r in results)),
        engine_tokens_per_answer=round(sum(w) / len(w), 1)
        if (w := [r.engine_tokens for r in good if r.engine_tokens is not None])
        else None,
    )


async def unloaded(ask: Ask, reqs: list[Request], server: Server, tag: str) -> Step:
    """The requests one at a time (the recording pass for coinfer's edges)."""
    t0, cpu0 = time.perf_counter(), server.cpu_s()
    results = [await ask(r, f"{tag}-u{i}") for i, r in enumerate(reqs)]
    return _step(0.0, results, time.perf_counter() - t0, server.cpu_s() - cpu0)


async def saturated(ask: Ask, reqs: list[Request], concurrency: int, server: Server, tag: str) -> Step:
    """Every request with ``concurrency`` in flight (closed loop), the replica's CPU time and the clock read as
    each answer comes; throughput and cost are taken over the middle half of the answers (the replica busy
    throughout: no ramp-up, no tail). vLLM's worker busy-polls its queue for a second after each step
    (``shm_broadcast``: ``busy_loop_s``), so at lower loads its CPU time follows wall time rather than work."""
    sem = asyncio.Semaphore(concurrency)
    t0, cpu0 = time.perf_counter(), server.cpu_s()
    marks: list[tuple[float, dict[str, float]]] = []

    async def one(i: int, r: Request) -> Result:
        async with sem:
            t1 = time.perf_counter()
            try:
                return await ask(r, f"{tag}-s{i}")
            except Exception as exc:  # noqa: BLE001 - a failed request is what this measures
                return Result(None, time.perf_counter() - t1, 0.0, failed=f"{type(exc).__name__}: {exc}"[:160])
            finally:
                marks.append((time.perf_counter(), server.cpu_by_process()))

    results = await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    step = _step(0.0, results, time.perf_counter() - t0, server.cpu_s() - cpu0)
    lo, hi = len(marks) // 4, (3 * len(marks)) // 4
    if hi > lo and marks[hi][0] > marks[lo][0]:  # the middle half
        (ta, ca), (tb, cb) = marks[lo], marks[hi]
        by = {name: cb[name] - ca.get(name, 0.0) for name in cb}
        step.answers, step.wall_s, step.cpu_s = hi - lo, round(tb - ta, 3), round(sum(by.values()), 3)
        step.cpu_s_per_answer_by_process = {name: round(c / step.answers, 4) for name, c in sorted(by.items())}
    return step


async def ladder(
    ask: Ask,
    reqs: list[Request],
    start: float,
    slo_s: float,
    args,
    server: Server,
    tag: str,
    progress: Callable[[str], None],
) -> list[Step]:
    """Rising rates from ``start`` (half the saturated throughput) until the SLO breaks or ``--max-steps``; when
    the first rate misses it, falling rates (a system whose unloaded latency is near the SLO holds it only
    well below saturation) down to ``--min-rate``. A rising ladder that held every rate climbs on, by the
    step squared, for up to ``--extend-steps`` more: a system whose saturated run is bound by its own
    latency rather than the replica (split on the real model: the edges' drafting, seconds, at 16 in
    flight) starts far below what the replica holds, and a capacity reached by running out of steps is
    only a lower bound (``summary`` says which)."""
    rng = random.Random(args.seed)
    rate = max(args.min_rate, start)
    steps: list[Step] = []

    async def at(rate: float) -> bool:
        step = await run_step(ask, reqs, rate, args.step_s, server, rng, f"{tag}-{rate:.2f}")
        steps.append(step)
        held = step.held(slo_s)
        progress(
            f"{tag}: rate {rate:.2f}/s -> {step.answers} answers, {step.failed} failed, p50 {step.p50_s:.2f} s, "
            f"p95 {step.p95_s:.2f} s (SLO {slo_s:.2f}), accuracy {step.accuracy}, {'held' if held else 'MISSED'}"
        )
        return held

    for i in range(args.max_steps + args.extend_steps):
        if i >= args.max_steps and not all(s.held(slo_s) for s in steps):
            break
        held = await at(rate)
        falling = not steps[0].held(slo_s)
        if falling and (held or rate <= args.min_rate):
            break
        if not falling and not held:
            break
        climb = args.rate_step**2 if i + 1 >= args.max_steps else args.rate_step
        rate = max(args.min_rate, rate / args.rate_step**2) if falling else rate * climb
    for _ in range(args.refine_steps):  # halve the gap between the highest rate held and the lowest missed above it
        lo = max((s.rate for s in steps if s.held(slo_s)), default=None)
        hi = min((s.rate for s in steps if not s.held(slo_s) and (lo is None or s.rate > lo)), default=None)
        if lo is None or hi is None:
            break
        await at(math.sqrt(lo * hi))
    return steps


def _by_process(step: Step) -> str:
    return ", ".join(f"{name} {c:.3f}" for name, c in step.cpu_s_per_answer_by_process.items())


async def measure(
    ask: Ask,
    reqs: list[Request],
    base: Step | None,
    slo_s: float,
    args,
    server: Server,
    tag: str,
    progress: Callable[[str], None],
) -> dict:
    """The saturated throughput and cost, then the ladder from half that throughput."""
    sat = await saturated(ask, reqs * args.saturate_rounds, args.saturate_concurrency, server, tag)
    through = sat.answers / max(sat.wall_s, 1e-9)
    progress(
        f"{tag}: saturated ({args.saturate_concurrency} in flight) {through:.2f} answers/s, "
        f"{sat.cpu_per_answer:.3f} cloud CPU-s/answer ({_by_process(sat)}), accuracy {sat.accuracy}"
    )
    step_s = args.real_step_s if reqs[0].case is None else args.step_s
    at = argparse.Namespace(**{**vars(args), "step_s": step_s})
    steps = await ladder(ask, reqs, 0.5 * through, slo_s, at, server, tag, progress)
    return summary(steps, slo_s, sat) | {"unloaded": dataclasses.asdict(base) if base is not None else None}
