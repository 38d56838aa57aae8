"""Liveness probes in their own process: how long a server's event loop makes a cheap call wait.

    python -m benchmarks.probe [--cloud HOST:PORT] [--http URL] [--period-ms 20]

Calls the cloud's ``Status`` and/or GETs ``--http`` (the edge's ``/healthz``) every period until
its standard input closes, then prints one JSON object: per probe, count, errors, p50 / p99 / max
in ms. A separate process, so that the load a benchmark generates (thousands of streams and
connections on its own loop) does not count as the server's delay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else 0.0


def summary(ms: list[float], errors: int) -> dict:
    return {
        "probes": len(ms),
        "errors": errors,
        "p50_ms": round(pct(ms, 0.5), 1),
        "p99_ms": round(pct(ms, 0.99), 1),
        "max_ms": round(max(ms, default=0.0), 1),
    }


async def _loop(fn: Callable[[], Awaitable[object]], period_s: float, ms: list[float], errors: list[int]) -> None:
    while True:
        t0 = time.perf_counter()
        try:
            await fn()
            ms.append((time.perf_counter() - t0) * 1e3)
        except Exception:  # noqa: BLE001 - a failed probe is counted
            errors[0] += 1
        await asyncio.sleep(period_s)


async def main_async(args: argparse.Namespace) -> dict:
    import grpc
    import httpx

    from coinfer.v1 import coinfer_pb2 as pb
    from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

    probes: dict[str, Callable[[], Awaitable[object]]] = {}
    channel = http = None
    if args.cloud:
        channel = grpc.aio.insecure_channel(args.cloud)
        stub = pb_grpc.CoinferCloudStub(channel)
        probes["cloud Status"] = lambda: stub.Status(pb.StatusRequest(), timeout=5)
    if args.http:
        http = httpx.AsyncClient()

        async def healthz() -> None:
            (await http.get(args.http, timeout=5)).raise_for_status()

        probes["edge /healthz"] = healthz
    results = {name: ([], [0]) for name in probes}
    tasks = [asyncio.create_task(_loop(fn, args.period_ms / 1e3, *results[name])) for name, fn in probes.items()]
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
    for task in tasks:
        task.cancel()
    if channel is not None:
        await channel.close()
    if http is not None:
        await http.aclose()
    return {name: summary(ms, err[0]) for name, (ms, err) in results.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cloud", default="", help="cloud HOST:PORT: probe Status")
    ap.add_argument("--http", default="", help="URL to GET (the edge's /healthz)")
    ap.add_argument("--period-ms", type=float, default=20.0)
    print(json.dumps(asyncio.run(main_async(ap.parse_args(argv)))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
