"""Whether the servers stay live: the probes of both Status RPCs and ``/healthz`` every 20 ms, from their own
process (``Prober``; ``probe_report`` per target), and ``alive``: both servers answer a normal request after
the campaign."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import edge_pb2 as epb
from scenarios.hostile.strategies.values import MODEL
from scenarios.hostile.targets import Clients, Endpoints

# ---- liveness probes (a separate process: the campaign's own CPU use must not read as a server stall) --

PROBE_PERIOD_S = 0.02
CONTROL = "prober.loop_lag"
"""The probing process's own lateness waking from a sleep: the machine's share of a probe's latency (a
spike in every probe and here at once is the machine, not a server's loop)."""


Samples = dict[str, list[tuple[float, float]]]
"""Per probe: (wall time it was sent, latency ms)."""


async def _probe_loop(ep: Endpoints, stop: Any, period_s: float) -> tuple[Samples, dict[str, dict]]:
    """Every probe's samples and error counts, until ``stop`` is set."""
    c = Clients(ep)
    cloud = c.cloud.unary_unary(
        "/coinfer.v1.CoinferCloud/Status",
        request_serializer=pb.StatusRequest.SerializeToString,
        response_deserializer=pb.StatusResponse.FromString,
    )
    edge = c.edge.unary_unary(
        "/coinfer.v1.CoinferEdge/Status",
        request_serializer=epb.EdgeStatusRequest.SerializeToString,
        response_deserializer=epb.EdgeStatus.FromString,
    )
    probes = {
        "cloud.Status": lambda: cloud(pb.StatusRequest(), timeout=5),
        "edge.Status": lambda: edge(epb.EdgeStatusRequest(), timeout=5),
        "edge./healthz": lambda: c.http.get("/healthz", timeout=5),
    }
    lat: Samples = {k: [] for k in (*probes, CONTROL)}
    errors: dict[str, Counter] = {k: Counter() for k in lat}

    async def one(name: str) -> None:
        nxt = time.perf_counter()
        while not stop.is_set():
            t0, sent = time.perf_counter(), time.time()
            try:
                r = await probes[name]()
                if isinstance(r, httpx.Response) and r.status_code != 200:
                    errors[name][f"HTTP {r.status_code}"] += 1
            except Exception as exc:  # noqa: BLE001 - counted: a probe that fails is a finding
                errors[name][type(exc).__name__] += 1
            lat[name].append((sent, (time.perf_counter() - t0) * 1e3))
            nxt = max(nxt + period_s, time.perf_counter())
            await asyncio.sleep(nxt - time.perf_counter())

    async def lag() -> None:
        while not stop.is_set():
            t0, sent = time.perf_counter(), time.time()
            await asyncio.sleep(period_s)
            lat[CONTROL].append((sent, max(0.0, time.perf_counter() - t0 - period_s) * 1e3))

    try:
        await asyncio.gather(lag(), *(one(k) for k in probes))
    finally:
        await c.close()
    return lat, {k: dict(v) for k, v in errors.items()}


def latency_stats(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else [ms[0]] * 99
    return {
        "n": len(ms),
        "p50_ms": round(q[49], 2),
        "p99_ms": round(q[98], 2),
        "max_ms": round(max(ms), 2),
        "over_50ms": sum(x > 50 for x in ms),
    }


def probe_report(samples: Samples, errors: dict[str, dict], windows: dict[str, tuple[float, float]]) -> dict:
    """Latency per probe over the whole campaign, and per target (while it ran): which input holds a loop."""

    def within(t0: float, t1: float) -> dict:
        return {k: latency_stats([ms for t, ms in v if t0 <= t < t1]) for k, v in samples.items()}

    return {
        "overall": {k: latency_stats([ms for _, ms in v]) | {"errors": errors[k]} for k, v in samples.items()},
        "by_target": {name: within(*w) for name, w in windows.items()},
    }


def _probe_main(ep: Endpoints, stop: Any, results: Any, period_s: float) -> None:
    results.put(asyncio.run(_probe_loop(ep, stop, period_s)))


class Prober:
    """The liveness probes in a child process (its own interpreter and event loop)."""

    def __init__(self, ep: Endpoints, period_s: float = PROBE_PERIOD_S) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process holding gRPC threads
        self.stop, self.results = ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=_probe_main, args=(ep, self.stop, self.results, period_s), daemon=True)

    def __enter__(self) -> Prober:
        self.proc.start()
        return self

    def finish(self) -> tuple[Samples, dict[str, dict]]:
        self.stop.set()
        out = self.results.get(timeout=60)
        self.proc.join(10)
        return out

    def __exit__(self, *exc: object) -> None:
        if self.proc.is_alive():
            self.proc.kill()


# ---- after the campaign -----------------------------------------------------------------------------


async def alive(ep: Endpoints, settle_s: float = 30.0) -> dict[str, str]:
    """After the campaign: each server answers its status and a normal request. A check that fails is retried
    for ``settle_s`` (the edge's circuit breaker may have opened on the campaign's cloud failures; it tries
    the cloud again after 10 s): "ok", "ok after N s (first: what failed)", or what failed."""
    c = Clients(ep)

    async def cloud_status() -> str:
        status = c.cloud.unary_unary(
            "/coinfer.v1.CoinferCloud/Status",
            request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusResponse.FromString,
        )
        st_ = await status(pb.StatusRequest(), timeout=10)
        return "ok" if st_.ready else f"not ready: {st_}"

    async def edge_solve() -> str:
        req = epb.SolveRequest(
            problem=pb.Problem(task="arith", prompt="If x=3 and y=5, compute x*y+x+y."),
            sampling=pb.SamplingParams(max_new_tokens=8, seed=1),
            num_drafts=2,
            plan="split",
            deadline_ms=20_000,
        )
        call = c.edge.unary_stream(
            "/coinfer.v1.CoinferEdge/Solve",
            request_serializer=epb.SolveRequest.SerializeToString,
            response_deserializer=epb.SolveEvent.FromString,
        )
        res = [e async for e in call(req, timeout=60)][-1].result
        return "ok" if res.answer and not res.fallback_reason else f"degraded: {res.source}, {res.fallback_reason!r}"

    async def healthz() -> str:
        r = await c.http.get("/healthz", timeout=10)
        return "ok" if r.status_code == 200 else f"HTTP {r.status_code}"

    async def chat() -> str:
        r = await c.http.post(
            "/v1/chat/completions",
            timeout=60,
            json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "What is 2 plus 3?"}]},
        )
        return "ok" if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"

    async def settled(fn: Callable[[], Awaitable[str]]) -> str:
        t0, first = time.perf_counter(), ""
        while True:
            try:
                got = await fn()
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                got = f"{type(exc).__name__}: {exc}"[:300]
            waited = time.perf_counter() - t0
            if got == "ok":
                return f"ok after {waited:.0f} s (first: {first})" if first else "ok"
            first = first or got
            if waited > settle_s:
                return first
            await asyncio.sleep(1.0)

    try:
        return {
            name: await settled(fn)
            for name, fn in (
                ("cloud.Status", cloud_status),
                ("edge.Solve", edge_solve),
                ("http.healthz", healthz),
                ("http.chat", chat),
            )
        }
    finally:
        await c.close()
