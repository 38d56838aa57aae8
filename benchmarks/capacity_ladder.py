"""The load generator of ``benchmarks.capacity``: one request as every system sends it, and the measurements of one
system on one workload (the unloaded pass, the saturated run, the ladder of open-loop Poisson rates on the shared rate
grid and the capacity it shows, the step at the workload's common rate). No servers are started here: a system is an
``Ask`` and the replica's ``Server`` (its CPU time)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.load_stats import Step, arrivals, grid_index, grid_rate, pct, summary, work_means, work_tokens
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
    work: dict | None = None
    """The engine's work for the answer, counted by its server (``load_stats.WORK_KEYS``; a key the server does
    not report is absent): coinfer's ``Summary.cost``, vLLM's usage with its prefix-cache hits."""
    edge_only: bool = False
    """Answered by the edge alone (no cloud session): a share of the requests, never cloud capacity."""

    @property
    def engine_tokens(self) -> int | None:
        """Tokens the target engine computed for the answer (``load_stats.work_tokens`` of ``work``): prefill past
        the prefix cache plus decoding, as coinfer's ``Summary.cost`` and vLLM's usage count them."""
        return work_tokens(self.work)


# ---- the ladder ----------------------------------------------------------------------------------------

Ask = Callable[[Request, str], "asyncio.Future[Result]"]


async def run_step(
    ask: Ask,
    reqs: list[Request],
    rate: float,
    step_s: float,
    server: Server,
    rng: random.Random,
    tag: str,
    first: int = 0,
) -> Step:
    """Poisson arrivals at ``rate`` for ``step_s`` seconds (requests in turn from ``reqs``, from its ``first``),
    drained."""
    offsets = arrivals(rate, step_s, rng)
    t0 = time.perf_counter()
    cpu0 = server.cpu_s()

    async def one(i: int, at: float) -> Result:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        try:
            return await ask(reqs[(first + i) % len(reqs)], f"{tag}-{i}")
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
        work_per_answer=work_means([r.work for r in good if r.work is not None]),
        edge_only_share=round(sum(r.edge_only for r in good) / len(good), 3) if good else 0.0,
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
    """Rates on the shared grid (``load_stats.grid_rate``), from the grid point nearest ``start`` (half the
    saturated throughput), ``--coarse-points`` grid points apart, rising until the SLO breaks or ``--max-steps``;
    when the first rate misses it, falling (a system whose unloaded latency is near the SLO holds it only well
    below saturation) down to ``--min-rate``. A rising ladder that held every rate climbs on, twice as far a step,
    for up to ``--extend-steps`` more: a system whose saturated run is bound by its own latency rather than the
    replica (split on the real model: the edges' drafting, seconds, at 16 in flight) starts far below what the
    replica holds, and a capacity reached by running out of steps is only a lower bound (``summary`` says which).
    Then up to ``--refine-steps`` bisections of the grid points between the highest rate held and the lowest missed
    above it, until they are neighbours: the capacity then known to one grid step (+-5% around their middle)."""
    rng = random.Random(args.seed)
    kmin = grid_index(args.min_rate, up=True)
    k = max(kmin, grid_index(max(start, args.min_rate)))  # (a saturated run that served nothing: 0)
    steps: list[Step] = []
    tried: dict[int, bool] = {}

    async def at(k: int) -> bool:
        rate = grid_rate(k)
        # each step goes on through the requests where the last left off: with more requests than a step sends, a
        # problem recurs only once the list is through (each step from the first again re-sent the same problems,
        # whose repeats the prefix cache -- and coinfer's kept check rows -- then served)
        sent = sum(s.answers + s.failed for s in steps)
        step = await run_step(ask, reqs, rate, args.step_s, server, rng, f"{tag}-{rate:.2f}", first=sent)
        steps.append(step)
        held = tried[k] = step.held(slo_s)
        progress(
            f"{tag}: rate {rate:.2f}/s -> {step.answers} answers, {step.failed} failed, p50 {step.p50_s:.2f} s, "
            f"p95 {step.p95_s:.2f} s (SLO {slo_s:.2f}), accuracy {step.accuracy}, {'held' if held else 'MISSED'}"
        )
        return held

    for i in range(args.max_steps + args.extend_steps):
        if i >= args.max_steps and not all(tried.values()):
            break
        held = await at(k)
        falling = not steps[0].held(slo_s)
        if falling and (held or k <= kmin):
            break
        if not falling and not held:
            break
        jump = args.coarse_points * (2 if i + 1 >= args.max_steps else 1)
        k = max(kmin, k - jump) if falling else k + jump
    for _ in range(args.refine_steps):  # bisect the grid between the highest rate held and the lowest missed above it
        lo = max((j for j, h in tried.items() if h), default=None)
        hi = min((j for j, h in tried.items() if not h and (lo is None or j > lo)), default=None)
        if lo is None or hi is None or hi - lo <= 1:
            break
        await at((lo + hi) // 2)
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
    common_rate: float | Callable[[dict], float] | None = None,
) -> dict:
    """The saturated throughput and cost, then the ladder from half that throughput, then (``common_rate``: a grid
    rate every system of the workload is measured at) the step at that rate, from the ladder where it ran there:
    the replica's CPU-s per answer at one offered load for every system (``at_common_rate``), where the saturated
    run's reads each system at its own. A callable ``common_rate`` is given this system's entry first (the system
    the common rate is derived from)."""
    sat = await saturated(ask, reqs * args.saturate_rounds, args.saturate_concurrency, server, tag)
    through = sat.answers / max(sat.wall_s, 1e-9)
    progress(
        f"{tag}: saturated ({args.saturate_concurrency} in flight) {through:.2f} answers/s, "
        f"{sat.cpu_per_answer:.3f} cloud CPU-s/answer ({_by_process(sat)}), accuracy {sat.accuracy}"
    )
    step_s = args.real_step_s if reqs[0].case is None else args.step_s
    at = argparse.Namespace(**{**vars(args), "step_s": step_s})
    steps = await ladder(ask, reqs, 0.5 * through, slo_s, at, server, tag, progress)
    out = summary(steps, slo_s, sat) | {"unloaded": dataclasses.asdict(base) if base is not None else None}
    if callable(common_rate):
        common_rate = common_rate(out)
    if common_rate:
        common = next((s for s in steps if s.rate == common_rate), None)
        if common is None:
            common = await run_step(ask, reqs, common_rate, step_s, server, random.Random(args.seed), f"{tag}-common")
            progress(
                f"{tag}: common rate {common_rate:.2f}/s -> {common.answers} answers, "
                f"{common.cpu_per_answer:.3f} cloud CPU-s/answer, p95 {common.p95_s:.2f} s"
            )
        out["at_common_rate"] = dataclasses.asdict(common) | {
            "cpu_s_per_answer": round(common.cpu_per_answer, 4),
            "held": common.held(slo_s),
        }
    return out
