"""What one cloud replica serves: coinfer's plans against plain vLLM on the same target, under open-loop load.

    .venv/bin/python -m benchmarks.capacity [--workloads arith select words real-open] [--json]
    .venv/bin/python -m benchmarks.capacity --workloads arith --systems split vllm-greedy --step-s 3

One cloud replica with its engine on one core (core 0: the server process and vLLM's engine core,
``taskset`` and ``VLLM_CPU_OMP_THREADS_BIND``); the edges and the load generator on the other (this
process). Systems, each on the same requests, the same target weights and dtype (``auto`` as coinfer resolves it,
``coinfer.cloud.vllm_common.engine_dtype``: float32 on an x86 CPU without bfloat16 instructions; the real
model in ``coinfer.quantize.real_model.CLOUD_DTYPE``, float32, which exact split needs), prefix caching on,
32-token KV blocks, eager mode, 64 sequences a step:

- ``split``, ``cloud``, ``auto``: coinfer's cloud service (``python -m coinfer.cloud.server``) behind an
  edge core in this process (``coinfer.edge.service.EdgeCore``: planner, breaker, pipeline, rules); ``auto``
  starts each workload from the planner's estimates as the edge started (calibrated), not from what the
  forced plans' ladders left in them;
- ``vllm-greedy``: vLLM's own OpenAI server on the target, greedy, streamed, the cloud's answer budget;
- ``vllm-repair``, ``vllm-resample``: the same, with coinfer's checkers and calculator on the answer in the client,
  and (resample) up to two seeded samples more while they refuse it (``benchmarks.capacity_vllm``): plain vLLM
  given the same checkers, the baseline that isolates co-inference's own effect;
- ``vllm-ngram``: vLLM's own n-gram speculative decoding (a server of its own);
- ``vllm-best-of-5``: ``n=5`` at temperature 0.7, majority vote on the extracted answer;
- ``split-remote``, ``cloud-remote`` (only when named in ``--systems``): coinfer's plans with the cloud service in
  front of vLLM's own OpenAI server (``--engine.url``: ``coinfer.cloud.remote_engine``), both on the replica's
  core; its CPU is both servers' processes, each under its server's name (``coinfer/python``: the session layer).

The edges' drafts are the real INT8 draft model's (ONNX Runtime), written in ``--draws`` recording passes over
every request before the load (``benchmarks.replica.ReplayDrafts``: each pass a fresh draw) and replayed under load,
a request's draws in turn, at the times the draft model wrote them: in production every user has an edge box of
their own, and one core here could not draft for dozens of concurrent users without making the edge, not the
cloud, the bottleneck. A draft request not recorded (sampling the recording did not see) is drafted for real and
counted (``draft_misses``); the recording passes' drafting CPU per answer is ``edge_draft_cpu_s_per_answer``.

Per workload, the SLO is ``--slo-factor`` (3) x the unloaded p50 latency of plain vLLM greedy on those
requests (the issue's suggestion): a system's capacity is the highest Poisson arrival rate at which the
p95 latency stayed within it with no request failed. Every rate is a point of one absolute grid shared by every
system and run (``load_stats.grid_rate``: 10% apart); a ladder starts at the point nearest half of what the
saturated run served, moves ``--coarse-points`` points a step, each rate held for ``--step-s`` seconds of arrivals
(the requests in turn, each step going on where the last left off: ``--requests`` beyond what the ladder sends
means no problem recurs within it, and no prefix cache serves a repeat) and the requests drained before the next,
then bisects (``--refine-steps``) until the highest rate held and the
lowest missed are neighbours: the capacity known to +-5%. A system that held every rate climbs ``--extend-steps``
more, and a capacity no higher rate was seen to miss is marked a lower bound (``capacity_lower_bound``). Reported
per system and workload at that rate: answers/s (``cloud_capacity_rps``: less the share the edge answered alone,
``edge_only_share``), the cloud's CPU-seconds per answer (every process of the replica: ``/proc`` user + system
time, over the answers: verification prefill, sessions and gRPC included) in the saturated run and at the
workload's common rate (``at_common_rate``: one offered rate for every system, half vLLM greedy's capacity on the
grid), the engine's work per answer as its server counts it (``work_per_answer``: ``load_stats.WORK_KEYS``),
accuracy (null for open prompts), p50 / p95 latency and the p50 time to first content. One run, one machine:
ratios side by side, no thresholds; ``benchmarks.capacity_runs`` summarises several.

Every system answers the same requests the same way: greedy, unpenalised, the same answer budget (coinfer's
request is built as its OpenAI API builds it from ``max_tokens``: the drafts sample, the cloud's answer is
greedy). coinfer's replica gets session slots past any load the SLO holds (``benchmarks.replica.MAX_SESSIONS``, none per edge:
the simulated edges share this process's connection). The CPU column reads the cost at 16 requests in
flight: vLLM's worker busy-polls between steps, so where a system's requests spend most of their time off
the replica (split's on the edge) it counts the replica's idle time too; the engine tokens per answer are
the count that does not depend on load.

``--json`` prints one JSON object last on stdout; progress lines (one per rate) go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import capacity_vllm
from benchmarks.capacity_ladder import Request, Result, measure, unloaded
from benchmarks.load_stats import WORK_KEYS, grid_index, grid_rate
from benchmarks.open_prompts import OPEN_PROMPTS
from benchmarks.replica import CLOUD_CORE, NGRAM_SPECULATION, PROMPT_DETAILS, coinfer_stack, remote_stack, vllm_server
from coinfer.cloud.vllm_common import engine_dtype

SYSTEMS = ("split", "cloud", "auto", "vllm-greedy", "vllm-repair", "vllm-resample", "vllm-ngram", "vllm-best-of-5")
"""What a run measures unless ``--systems`` says otherwise."""
COINFER_SYSTEMS = ("split", "cloud", "auto")
REMOTE_SYSTEMS = ("split-remote", "cloud-remote")
"""coinfer's plans over the remote engine (``coinfer.cloud.remote_engine``): the cloud service with ``--engine.url``,
the target on vLLM's own OpenAI server, both on the replica's core (asked for by name)."""
REMOTE = "-remote"
DEMO_KINDS = ("arith", "select", "words")
REAL = "real-open"
WORKLOADS = (*DEMO_KINDS, REAL)
REAL_MAX_TOKENS = 96
"""The real-model request set's answer budget (a 135M model's prose on one core: ~20 tokens/s); this
benchmark's default is ``--real-max-tokens``."""
REAL_MAX_MODEL_LEN = 2048
"""Both servers' context on the real model (its own is 8192; the demo target's own 1024 is kept)."""
DEMO_MAX_TOKENS = 512
"""The demo pair's answer budget: the cloud's default (``PolicyConfig.refine_max_tokens``)."""

REAL_PROMPTS = OPEN_PROMPTS
"""The real-open workload's prompts, the first ``--real-requests`` of ``benchmarks.open_prompts`` (128 distinct; the
first 16 are the historical set)."""


def workload(name: str, n: int, seed: int, real_max_tokens: int = REAL_MAX_TOKENS) -> list[Request]:
    if name == REAL:
        prompts = (REAL_PROMPTS * (n // len(REAL_PROMPTS) + 1))[:n]
        return [Request([{"role": "user", "content": p}], None, real_max_tokens) for p in prompts]
    from benchmarks.open_accuracy import cases

    return [Request([{"role": "user", "content": c.prompt}], c, DEMO_MAX_TOKENS) for c in cases((name,), n, seed)]


def _solve_request(req: Request, plan: str, rid: str, deadline_ms: int):
    from coinfer.chat import ChatMessage
    from coinfer.edge.http import draft_sampling, refine_sampling
    from coinfer.edge.service import SolveRequest
    from coinfer.extract import Extraction

    case = req.case
    # as the OpenAI API builds it from ``max_tokens`` (``edge.http``): the drafts sample with the daemon's
    # defaults, the cloud's answer is greedy, unpenalised -- as plain vLLM greedy's. (Until 2026-12-03 the
    # answer here sampled with the draft defaults, top-p 0.95 and penalties: vLLM-CPU's sampler then ran at
    # half the answers/s of greedy, which read as coinfer's cost.)
    given = {} if case is not None else {"max_new_tokens": req.max_tokens}
    return SolveRequest(
        prompt="",
        messages=[ChatMessage(m["role"], m["content"]) for m in req.messages],
        task=case.task if case is not None else "",
        rules=case.rules() if case is not None else [],
        extraction=case.extraction() if case is not None else Extraction(),
        sampling=draft_sampling(given),
        refine=refine_sampling(given),
        plan=plan,
        deadline_ms=deadline_ms,
        request_id=rid,
    )


async def ask_coinfer(core, req: Request, plan: str, rid: str, deadline_ms: int) -> Result:
    from coinfer import types as t
    from coinfer.edge.service import Done

    t0 = time.perf_counter()
    ttft, done = 0.0, None
    async for ev in core.solve(_solve_request(req, plan, rid, deadline_ms)):
        # what an OpenAI stream shows: final text only (a chunk that may still be withdrawn is held there)
        if isinstance(ev, t.AnswerChunk) and ev.text and ev.final and not ttft:
            ttft = time.perf_counter() - t0
        elif isinstance(ev, Done):
            done = ev
    lat = time.perf_counter() - t0
    r = done.result
    fell_back = f"fallback: {r.fallback_kind}" if r.fallback_reason else ""
    cost = r.summary.cost if r.summary is not None else None
    edge_only = done.plans == ["edge"]
    work = (  # edge: no cloud
        {k: getattr(cost, k) for k in WORK_KEYS}
        if cost is not None
        else (dict.fromkeys(WORK_KEYS, 0) if edge_only else None)
    )
    source = "->".join(done.plans) + f":{r.source}"
    return Result(req.grade(r.answer), lat, ttft or lat, fell_back, source, work, edge_only)


# ---- the run -------------------------------------------------------------------------------------------


async def _vllm_systems(
    wls: list[str],
    reqs: dict,
    args,
    model: Path,
    log_dir: Path,
    slo: dict,
    common: dict,
    out: dict,
    progress,
    max_len: int,
    dtype: str,
) -> None:
    """The plain-vLLM systems, those of ``capacity_vllm.PLAIN_SERVER`` on one server (in that order: vLLM greedy
    first, whose unloaded pass sets each workload's SLO and whose capacity its common rate), ``vllm-ngram`` on a
    server of its own (vLLM's n-gram speculative decoding)."""
    plain = [s for s in capacity_vllm.PLAIN_SERVER if s in args.systems]
    for systems, speculative in (
        (plain, None),
        (["vllm-ngram"] if "vllm-ngram" in args.systems else [], NGRAM_SPECULATION),
    ):
        if not systems:
            continue
        async with vllm_server(model, log_dir, max_len, dtype, speculative, PROMPT_DETAILS) as (srv, client, name):
            for system in systems:
                ask = capacity_vllm.asker(system, client, name)
                for wl in wls:
                    await ask(reqs[wl][0], "warm")  # lazy set-up out of the measurement
                    base = None
                    if system == "vllm-greedy":  # every request alone: the SLO's base (open prompts' lengths vary)
                        base = await unloaded(ask, reqs[wl], srv, f"{wl}/{system}")
                        slo[wl] = round(args.slo_factor * base.p50_s, 3)
                        progress(f"{wl}/{system}: unloaded p50 {base.p50_s:.3f} s -> SLO {slo[wl]:.3f} s")
                    slo.setdefault(wl, args.slo_s)  # no vLLM greedy run to derive it from: the given SLO
                    out.setdefault(wl, {})[system] = await measure(
                        ask,
                        reqs[wl],
                        base,
                        slo[wl],
                        args,
                        srv,
                        f"{wl}/{system}",
                        progress,
                        _common(args, wl, common, system),
                    )


def _common(args, wl: str, common: dict, system: str = ""):
    """The workload's common rate (``measure``'s ``common_rate``), recorded in ``common``: ``--common-rate`` on the
    grid; else the grid point nearest half vLLM greedy's capacity, set from greedy's own entry (``system``
    ``vllm-greedy``: a callable); a run without vLLM greedy: the grid point at ``--min-rate``."""
    kmin = grid_index(args.min_rate, up=True)
    if args.common_rate:
        common[wl] = grid_rate(max(kmin, grid_index(args.common_rate)))
    if wl in common:
        return common[wl]
    if system != "vllm-greedy":
        common[wl] = grid_rate(kmin)
        return common[wl]

    def from_greedy(entry: dict) -> float:
        cap = entry["capacity_rps"]
        common[wl] = grid_rate(max(kmin, grid_index(cap / 2))) if cap > 0 else grid_rate(kmin)
        return common[wl]

    return from_greedy


async def _coinfer_systems(
    wls: list[str],
    reqs: dict,
    args,
    model: Path,
    draft: Path,
    log_dir: Path,
    slo: dict,
    common: dict,
    out: dict,
    progress,
    max_len: int,
    dtype: str,
) -> None:
    async with coinfer_stack(model, draft, log_dir, max_len, dtype, draws=args.draws) as (srv, core, drafts):
        systems = [s for s in COINFER_SYSTEMS if s in args.systems]
        await _coinfer_plans(systems, wls, reqs, args, srv, core, drafts, slo, common, out, progress)


async def _remote_systems(
    wls: list[str],
    reqs: dict,
    args,
    model: Path,
    draft: Path,
    log_dir: Path,
    slo: dict,
    common: dict,
    out: dict,
    progress,
    max_len: int,
    dtype: str,
) -> None:
    """coinfer's plans over the remote engine: vLLM's OpenAI server (its prefix-cache hits in its usage, which the
    cost counts read) and the cloud service in front of it, measured together."""
    async with remote_stack(model, draft, log_dir, max_len, dtype, draws=args.draws) as (replica, core, drafts):
        systems = [s for s in REMOTE_SYSTEMS if s in args.systems]
        await _coinfer_plans(systems, wls, reqs, args, replica, core, drafts, slo, common, out, progress)


async def _coinfer_plans(
    systems: list[str],
    wls: list[str],
    reqs: dict,
    args,
    srv,
    core,
    drafts,
    slo: dict,
    common: dict,
    out: dict,
    progress,
) -> None:
    """Each of coinfer's ``systems`` (a plan, over the remote engine where it ends in ``REMOTE``) on each workload:
    unloaded passes that record the drafts (``--draws`` of them: the first is the unloaded measurement; a system
    whose requests' draws are recorded already replays them), then the measurement. The edge's drafting CPU per
    answer (``edge_draft_cpu_s_per_answer``) is the passes' CPU per fresh drafting call times their calls per answer."""
    deadline_ms = int(args.deadline_s * 1e3)
    calibrated = copy.deepcopy(core.planner.est.table)  # the edge's planner as started, before any system ran
    for wl in wls:
        slo.setdefault(wl, args.slo_s)  # no vLLM greedy run to derive it from: the given SLO
        for system in systems:
            if system.removesuffix(REMOTE) == "auto":
                # auto as a freshly started edge, not on what the forced plans' ladders taught the shared planner:
                # their last, overloaded rates left a split of 1-2 s in its estimates, and auto never tried split
                # again within its own run (select, 2026-12-06: 14 of 16 unloaded requests on the cloud plan)
                core.planner.est.table = copy.deepcopy(calibrated)

            async def ask(r: Request, rid: str, plan=system.removesuffix(REMOTE)) -> Result:
                return await ask_coinfer(core, r, plan, rid, deadline_ms)

            drafts.recording = True  # every request alone: its drafts recorded, the planner warmed
            cpu0, calls0, fresh0 = drafts.draft_cpu_s, drafts.calls, drafts.fresh
            base = await unloaded(ask, reqs[wl], srv, f"{wl}/{system}")
            passes = args.draws if system.removesuffix(REMOTE) != "cloud" else 1
            for d in range(1, passes):
                await unloaded(ask, reqs[wl], srv, f"{wl}/{system}-draw{d}")  # more draws of every request's drafts
            # the drafting CPU per answer: per drafting call as the passes' fresh ones cost, times the calls an answer
            # made (a replayed call -- a draw recorded already, auto's of split's -- would have cost as much)
            calls, fresh = drafts.calls - calls0, drafts.fresh - fresh0
            drafting = (drafts.draft_cpu_s - cpu0) / fresh * calls / (len(reqs[wl]) * passes) if fresh else 0.0
            drafts.recording = False
            progress(
                f"{wl}/{system}: unloaded (recording) p50 {base.p50_s:.3f} s, "
                f"{base.cpu_per_answer:.3f} CPU-s/answer, accuracy {base.accuracy}"
            )
            misses = drafts.misses
            out.setdefault(wl, {})[system] = await measure(
                ask, reqs[wl], base, slo[wl], args, srv, f"{wl}/{system}", progress, _common(args, wl, common)
            ) | {
                "draft_misses": drafts.misses - misses,
                "edge_draft_cpu_s_per_answer": round(drafting, 4) if drafting > 0 else None,
            }


async def run(args, progress: Callable[[str], None]) -> dict:
    """The whole measurement; this process (edges, load) runs off ``CLOUD_CORE`` meanwhile."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {c for c in cpus if c != CLOUD_CORE} or cpus)
    try:
        return await _run(args, progress)
    finally:
        os.sched_setaffinity(0, cpus)


def pair(real: bool) -> tuple[Path, Path, int, str]:
    """The target's directory, the edge's INT8 draft, the servers' context and the target's dtype: the real model's
    (``real``) or the demo pair's (built or read from the model cache)."""
    if real:
        from coinfer.quantize.real_model import CLOUD_DTYPE, edge_dir, imported_dir

        return Path(imported_dir()), Path(edge_dir()), REAL_MAX_MODEL_LEN, CLOUD_DTYPE
    from coinfer.demo.artifacts import ensure_artifacts

    art = ensure_artifacts()
    return Path(art.target), Path(art.draft_int8), 1024, "auto"


async def _run(args, progress: Callable[[str], None]) -> dict:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(128))  # replayed drafts sleep in threads
    out: dict = {}
    slo: dict = {}
    common: dict = {}
    t0 = time.perf_counter()
    log_dir = Path(tempfile.mkdtemp(prefix="capacity-"))  # the servers' logs, kept for a failed run
    progress(f"server logs in {log_dir}")
    demo = [w for w in args.workloads if w in DEMO_KINDS]
    stacks = []
    if demo:
        stacks.append((demo, *pair(real=False)))
    if REAL in args.workloads:
        stacks.append(([REAL], *pair(real=True)))
    dtypes = {}
    for wls, model, draft, max_len, dtype in stacks:
        dtype = args.dtype or dtype
        dtypes[",".join(wls)] = engine_dtype(dtype)
        reqs = {
            w: workload(w, args.requests if w != REAL else args.real_requests, args.seed, args.real_max_tokens)
            for w in wls
        }
        if any(s.startswith("vllm") for s in args.systems):
            await _vllm_systems(wls, reqs, args, model, log_dir, slo, common, out, progress, max_len, dtype)
        if any(s in COINFER_SYSTEMS for s in args.systems):
            await _coinfer_systems(wls, reqs, args, model, draft, log_dir, slo, common, out, progress, max_len, dtype)
        if any(s in REMOTE_SYSTEMS for s in args.systems):
            await _remote_systems(wls, reqs, args, model, draft, log_dir, slo, common, out, progress, max_len, dtype)
    return {
        "slo_s": slo,
        "slo_rule": f"{args.slo_factor} x plain vLLM greedy's unloaded p50 on the workload",
        "common_rate_rps": common,
        "target_dtype": dtypes,
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "wall_s": round(time.perf_counter() - t0, 1),
        "workloads": out,
    }


def table(report: dict) -> str:
    """The report as the markdown table docs/measurements.md keeps."""
    rows = [
        "| workload | system | capacity (answers/s at SLO) | of it the cloud's | saturated answers/s "
        "| cloud CPU-s / answer (saturated) | at the common rate | engine tokens / answer | accuracy | p50 s | p95 s "
        "| first content p50 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl, systems in report["workloads"].items():
        for name, r in systems.items():
            common = r.get("at_common_rate") or {}
            rows.append(
                f"| {wl} (SLO {report['slo_s'].get(wl, 0):.2f} s) | {name} | "
                f"{'>= ' if r.get('capacity_lower_bound') else ''}{r['capacity_rps']} | {r.get('cloud_capacity_rps')} | "
                f"{r['saturated_answers_per_s']} | {r['cloud_cpu_s_per_answer']} | "
                f"{common.get('cpu_s_per_answer', '-')} at {common.get('rate', '-')}/s | {r['engine_tokens_per_answer']} | "
                f"{r['accuracy']} | {r['p50_s']} | {r['p95_s']} | {r['ttft_p50_s']} |"
            )
    rows += [
        "",
        "Engine work per answer, as the servers count it (the saturated run; - : not reported by that server)",
        "",
        "| workload | system | engine requests | prompt positions | of them cached | computed to score a text "
        "| decoded | sequential steps | edge drafting CPU-s / answer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for wl, systems in report["workloads"].items():
        for name, r in systems.items():
            w = r.get("work_per_answer") or {}
            cells = " | ".join(str(w.get(k, "-")) for k in WORK_KEYS)
            rows.append(f"| {wl} | {name} | {cells} | {r.get('edge_draft_cpu_s_per_answer') or '-'} |")
    rows += [
        "",
        "Unloaded (one request at a time; coinfer's edges drafting for real): streamed time to first content and "
        "total latency, p50",
        "",
        "| workload | system | first content p50 s | total p50 s | first content / vLLM greedy's |",
        "|---|---|---|---|---|",
    ]
    for wl, systems in report["workloads"].items():
        greedy = (systems.get("vllm-greedy") or {}).get("unloaded") or {}
        for name, r in systems.items():
            u = r.get("unloaded")
            if not u:
                continue
            ratio = f"{u['ttft_p50_s'] / greedy['ttft_p50_s']:.2f}x" if greedy.get("ttft_p50_s") else "-"
            rows.append(f"| {wl} | {name} | {u['ttft_p50_s']} | {u['p50_s']} | {ratio} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS + REMOTE_SYSTEMS)
    ap.add_argument("--requests", type=int, default=16, help="distinct held-out problems per demo workload")
    ap.add_argument(
        "--real-requests",
        type=int,
        default=6,
        help="distinct open prompts for the real model (128 at most: more repeat)",
    )
    ap.add_argument(
        "--real-max-tokens",
        type=int,
        default=64,
        help=f"every system's answer budget on open prompts (the request set's {REAL_MAX_TOKENS}: a 20-minute run)",
    )
    ap.add_argument("--step-s", type=float, default=3.0, help="seconds of arrivals per rate (demo workloads)")
    ap.add_argument(
        "--real-step-s", type=float, default=10.0, help="seconds of arrivals per rate (real model; ~the SLO or more)"
    )
    ap.add_argument(
        "--coarse-points",
        type=int,
        default=4,
        help="grid points between the ladder's rates before it bisects (4: 1.47x)",
    )
    ap.add_argument("--max-steps", type=int, default=5)
    ap.add_argument(
        "--extend-steps", type=int, default=1, help="more rates (each the last times the step squared) while all held"
    )
    ap.add_argument(
        "--refine-steps",
        type=int,
        default=3,
        help="bisections of the grid between the highest rate held and lowest missed",
    )
    ap.add_argument("--draws", type=int, default=1, help="recorded draws of each request's drafts, replayed in turn")
    ap.add_argument(
        "--common-rate",
        type=float,
        default=0.0,
        help="the rate every system's CPU is read at (0: half vLLM greedy's capacity)",
    )
    ap.add_argument("--saturate-concurrency", type=int, default=16, help="requests in flight in the saturated run")
    ap.add_argument("--saturate-rounds", type=int, default=3, help="the workload's requests this many times there")
    ap.add_argument("--min-rate", type=float, default=0.2)
    ap.add_argument("--slo-factor", type=float, default=3.0)
    ap.add_argument("--slo-s", type=float, default=10.0, help="the SLO where vLLM greedy is not run")
    ap.add_argument("--deadline-s", type=float, default=60.0, help="coinfer requests' deadline")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument(
        "--dtype",
        default="",
        choices=("", "auto", "float32", "bfloat16", "float16"),
        help="the target's dtype in every system (empty: the pair's own, auto for the demo pair)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object last on stdout")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    t0 = time.monotonic()

    def progress(line: str) -> None:
        m, sec = divmod(int(time.monotonic() - t0), 60)
        print(f"[{m:02d}:{sec:02d}] {line}", file=sys.stderr, flush=True)

    report = asyncio.run(run(args, progress))
    if args.json:
        print(json.dumps(report))
    else:
        print(table(report))
        print(f"SLO: {report['slo_rule']}; {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
