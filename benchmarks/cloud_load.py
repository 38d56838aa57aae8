"""Cloud service under load: verification overhead, batching across sessions, latency by stage.

    .venv/bin/python -m benchmarks.cloud_load [--sessions 48] [--json]

Real vLLM (demo target) behind real gRPC on 127.0.0.1. Drafts are written up front by the
demo draft model (5 per problem, the edge's default n) so that only the cloud is timed:

1. verification overhead: a session sends its 5 drafts at once; overhead = (session time -
   refinement time) / refinement time (the issue's target: <= 10%).
2. batching: the same sessions one at a time, then 16 at a time; throughput ratio (target >= 8x).
3. p50 / p95 by stage (verify, refinement time to first token, refinement, total) at 1 and 16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import grpc

from coinfer import convert
from coinfer import types as t
from coinfer.tasks import TASKS, problems
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def make_workload(n: int, drafts: int, seed: int = 3) -> list[tuple[t.OpenRequest, list[str]]]:
    from coinfer.chat import ChatMessage
    from coinfer.demo.artifacts import ensure_artifacts
    from coinfer.edge.draft_engine import OrtDraftEngine
    from coinfer.edge.sampling import Sampling

    eng = OrtDraftEngine(ensure_artifacts().draft_onnx)
    stream = problems(random.Random(seed), tuple(TASKS), held_out=True)
    out = []
    for i in range(n):
        p = next(stream)
        texts = [
            d.text
            for d in eng.generate(
                eng.render([ChatMessage("user", p.prompt)]),
                Sampling(n=drafts, temperature=0.7, presence_penalty=0.0, frequency_penalty=0.0, seed=100 * i),
            )
        ]
        out.append(
            (t.OpenRequest(request_id=f"bench-{i}", task=p.task, prompt=p.prompt, expected_drafts=drafts), texts)
        )
    return out


async def one_session(stub, req: t.OpenRequest, texts: list[str]) -> dict:
    async def msgs():
        yield pb.EdgeMessage(open=convert.open_to_pb(req))
        for i, x in enumerate(texts):
            yield pb.EdgeMessage(draft=pb.Draft(index=i, text=x, num_tokens=len(x)))
        yield pb.EdgeMessage(done=pb.DraftsDone(count=len(texts)))

    t0 = time.perf_counter()
    summary = None
    async for m in stub.Session(msgs(), timeout=300):
        ev = convert.event_from_pb(m)
        if isinstance(ev, t.RetryAdvice):
            continue  # the edge has nothing more: the cloud answers after the bound
        if isinstance(ev, t.Summary):
            summary = ev
    wall = (time.perf_counter() - t0) * 1e3
    tm = summary.timings
    return {
        "wall_ms": wall,
        "verify_ms": tm.verify_ms,
        "ttft_ms": tm.refine_ttft_ms,
        "refine_ms": tm.refine_ms,
        "total_ms": tm.total_ms,
        "source": int(summary.source),
    }


async def run(concurrency: int, stub, work) -> tuple[float, list[dict]]:
    sem = asyncio.Semaphore(concurrency)

    async def guarded(req, texts):
        async with sem:
            return await one_session(stub, req, texts)

    t0 = time.perf_counter()
    rows = await asyncio.gather(*(guarded(r, x) for r, x in work))
    return time.perf_counter() - t0, rows


def stages(rows: list[dict]) -> dict:
    return {
        k: {"p50": pct([r[k] for r in rows], 0.5), "p95": pct([r[k] for r in rows], 0.95)}
        for k in ("verify_ms", "ttft_ms", "refine_ms", "total_ms")
    }


async def main_async(args) -> dict:
    from coinfer.cloud.config import CloudConfig, EngineConfig
    from coinfer.cloud.server import create_server
    from coinfer.cloud.vllm_engine import VllmEngine
    from coinfer.demo.artifacts import ensure_artifacts

    work = make_workload(args.sessions, args.drafts)
    cfg = CloudConfig(engine=EngineConfig(model=str(ensure_artifacts().target)))
    srv = await create_server(cfg)
    await srv.attach_engine(await VllmEngine(cfg.engine).start())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            stub = pb_grpc.CoinferCloudStub(ch)
            await run(4, stub, work[:4])  # warm-up
            wall1, rows1 = await run(1, stub, work)
            wall16, rows16 = await run(args.concurrency, stub, work)
    finally:
        await srv.stop(grace=1)
    refined = [r for r in rows1 if r["source"] == int(t.AnswerSource.REFINED)] or rows1
    overhead = [(r["total_ms"] - r["refine_ms"]) / r["refine_ms"] for r in refined if r["refine_ms"] > 0]
    return {
        "sessions": args.sessions,
        "drafts_per_session": args.drafts,
        "concurrency": args.concurrency,
        "verify_overhead_median": statistics.median(overhead) if overhead else None,
        "verify_overhead_sessions": len(overhead),
        "throughput_1": args.sessions / wall1,
        f"throughput_{args.concurrency}": args.sessions / wall16,
        "throughput_ratio": wall1 / wall16,
        "stages_1": stages(rows1),
        f"stages_{args.concurrency}": stages(rows16),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=48)
    ap.add_argument("--drafts", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    c = args.concurrency
    print(
        f"verification of {args.drafts} drafts adds {100 * res['verify_overhead_median']:.1f}% (median, "
        f"{res['verify_overhead_sessions']} refined sessions) to the refinement time (target <= 10%)"
    )
    print(
        f"throughput: {res['throughput_1']:.2f} sessions/s at 1, {res[f'throughput_{c}']:.2f} at {c}: "
        f"{res['throughput_ratio']:.2f}x (target >= 8x)"
    )
    for key in ("stages_1", f"stages_{c}"):
        print(key, "  ".join(f"{k} p50 {v['p50']:.0f} / p95 {v['p95']:.0f}" for k, v in res[key].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
