"""One coinfer plan at one offered rate: every request's latency beside the engine work its answer cost.

    .venv/bin/python -m benchmarks.fixed_rate --workload words --plan split --rate 22 [--json out.json]

``benchmarks.capacity`` says how much load a system holds; this says why a plan's p95 is what it is: the same
replica and edges (``benchmarks.replica.coinfer_stack``, the replica pinned to its core, the drafts recorded in
``--draws`` unloaded passes and replayed), then Poisson arrivals at ``--rate`` for ``--step-s`` seconds, and per
request its latency, first content and ``Summary.cost`` (engine requests, prompt positions and those the prefix
cache served, decoded tokens). Printed: p50 / p95, the work per answer, how many answers took each number of
engine requests, the work of the slowest answers, and the replica's CPU per answer by process. A plan ending in
``-remote`` runs over the remote engine (vLLM's own OpenAI server, both processes on the replica's core, their CPU by
process). One run, one machine: before / after a change, side by side, never a threshold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import capacity
from benchmarks.capacity_ladder import Request, Result, run_step, unloaded
from benchmarks.replica import CLOUD_CORE, coinfer_stack, remote_stack


def _row(req: Request, res: Result) -> dict:
    return {
        "latency_s": round(res.latency_s, 4),
        "ttft_s": round(res.ttft_s, 4),
        "ok": res.ok,
        "source": res.source,
        "failed": res.failed,
        "work": res.work,
        "prompt": req.messages[-1]["content"][:80],
    }


def summary(rows: list[dict]) -> dict:
    """p50 / p95 latency, the mean work per answer, the answers by engine requests, the slowest answers' work."""
    done = [r for r in rows if r["work"] is not None]
    lat = sorted(r["latency_s"] for r in rows)

    def mean(key: str) -> float:
        return round(statistics.fmean(r["work"][key] for r in done), 2) if done else 0.0

    by_latency = sorted(done, key=lambda r: r["latency_s"])
    return {
        "answers": len(rows),
        "failed": sum(1 for r in rows if r["failed"]),
        "p50_s": round(lat[len(lat) // 2], 3) if lat else None,
        "p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3) if lat else None,
        "accuracy": round(statistics.fmean(bool(r["ok"]) for r in rows if r["ok"] is not None), 3)
        if any(r["ok"] is not None for r in rows)
        else None,
        "per_answer": {
            "engine_requests": mean("engine_requests"),
            "computed_prompt": round(mean("prompt_tokens") - mean("cached_tokens"), 1),
            "cached": mean("cached_tokens"),
            "decoded": mean("decoded_tokens"),
        },
        "answers_by_engine_requests": dict(sorted(Counter(r["work"]["engine_requests"] for r in done).items())),
        "slowest": [{"latency_s": r["latency_s"], **r["work"]} for r in by_latency[-5:]],
    }


async def run(args) -> dict:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(128))  # replayed drafts sleep in threads
    model, draft, max_len, dtype = capacity.pair(real=args.workload == capacity.REAL)
    reqs = capacity.workload(args.workload, args.requests, args.seed)
    rows: list[dict] = []
    log_dir = Path(tempfile.mkdtemp(prefix="fixed-rate-"))
    plan = args.plan.removesuffix(capacity.REMOTE)
    remote = plan != args.plan  # the remote engine: vLLM's own server, the cloud service in front of it
    stack = remote_stack if remote else coinfer_stack
    async with stack(model, draft, log_dir, max_len, dtype, draws=args.draws) as (srv, core, drafts):

        async def ask(req: Request, rid: str) -> Result:
            res = await capacity.ask_coinfer(core, req, plan, rid, int(args.deadline_s * 1e3))
            rows.append(_row(req, res))
            return res

        drafts.recording = True
        for d in range(args.draws):
            await unloaded(ask, reqs, srv, f"draw{d}")
        drafts.recording = False
        rows.clear()
        before = srv.cpu_by_process()
        step = await run_step(ask, reqs, args.rate, args.step_s, srv, random.Random(args.seed), "load")
        after = srv.cpu_by_process()
    # the replica's CPU per answer by process: at a rate below capacity vLLM's worker busy-polls, so its share follows
    # wall time; the session layer's (``python``: coinfer's cloud process) is its own work
    cpu = {name: round((after[name] - before.get(name, 0.0)) / max(1, step.answers), 4) for name in sorted(after)}
    return {"args": vars(args), "summary": summary(rows) | {"cpu_s_per_answer_by_process": cpu}, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="words", choices=capacity.WORKLOADS)
    ap.add_argument("--plan", default="split", choices=capacity.COINFER_SYSTEMS + capacity.REMOTE_SYSTEMS)
    ap.add_argument("--rate", type=float, default=22.0, help="offered requests per second")
    ap.add_argument("--step-s", type=float, default=10.0, help="seconds of arrivals")
    ap.add_argument("--requests", type=int, default=100, help="distinct problems (open prompts: up to 16)")
    ap.add_argument("--draws", type=int, default=2, help="recorded draws of each request's drafts")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--deadline-s", type=float, default=60.0)
    ap.add_argument("--json", help="write the report, every request's row included, here")
    args = ap.parse_args(argv)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {c for c in cpus if c != CLOUD_CORE} or cpus)  # the replica has its core
    report = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
