"""Soak: constant load through real edge daemons into one real cloud replica; memory and descriptors over time.

    .venv/bin/python -m benchmarks.soak --minutes 10 --concurrency 64 [--out docs/faults/soak.json]

Starts one ``python -m coinfer.cloud.server`` (vLLM on CPU with the demo target, ``--max-num-seqs`` =
the concurrency) and ``--edges`` ``python -m coinfer.edge.daemon`` processes (default: one per 32 requests
in flight). The cloud allows ``Limits.max_sessions_per_edge`` = 32 sessions per caller and, without
auth, a caller is its host without the port, so every daemon on 127.0.0.1 would be one caller: the
cloud therefore runs with ``--auth-tokens`` and each daemon has its own token (its own quota).
``--concurrency`` clients post continuously to the daemons' OpenAI-compatible HTTP API (round
robin by client; half streamed; small ``max_tokens``; plan ``split`` so every request opens a cloud session;
held-out problems from ``benchmarks.replicas._problems``) until ``--minutes`` have passed, then the
requests in flight finish.

Every ``--sample-s`` seconds: RSS and open descriptors of the cloud's process tree (server + vLLM
engine core + model worker) and of the edges' trees (all daemons summed), each summed over the process and all its
descendants (RSS counts a forked child's shared pages once per process and drops when the kernel
evicts library pages for another workload, so PSS -- the tree's real footprint -- and USS -- private
pages, where a leak shows -- are reported too), and the cloud's ``Status.active_sessions``. One more sample after
the load has drained (sessions should be back to 0, descriptors back near the start).

Reported (a measurement, never asserted): warm-up = the first 20% of the run (at least 60 s when
the run is >= 5 min); growth after warm-up = mean of the last 3 samples / mean of the first 3
samples after warm-up - 1, per tree, for RSS (target < 5%; PSS and USS alongside) and descriptors (target: flat);
requests by outcome (``ok``, ``http_<code>``, exception name, ``incomplete_stream``), answer
source (cloud / edge-only with the reason), p50 / p95 latency, throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import httpx
import psutil

from scenarios.replicas import Replica, _pct, _problems, free_ports


@dataclass
class Result:
    start: float
    end: float = 0.0
    kind: str = ""
    """``ok``, ``http_<code>``, an exception class name, or ``incomplete_stream``."""
    stream: bool = False
    source: str = ""
    fallback: str = ""
    body: str = ""
    """The first bytes of a failed response (what the server said)."""
    status: int = 0
    """HTTP status once the response head arrived (0: it never did)."""
    events: int = 0
    """SSE lines received before the end (a stream cut mid-way has some)."""

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1e3


@dataclass
class Sample:
    t: float
    """Seconds since the load started."""
    rss_mb: dict[str, float]
    pss_mb: dict[str, float]
    uss_mb: dict[str, float]
    fds: dict[str, int]
    uss_by_proc: dict[str, float]
    """USS MB of each process ("tree/name-pid"): which one grows."""
    active_sessions: int
    in_flight: int
    done: int


class Edge:
    """One ``python -m coinfer.edge.daemon`` process group; stdout (with its ``HTTP n`` line) goes to a log."""

    def __init__(self, i: int, draft: Path, cloud_port: int, token_file: Path, log_dir: Path) -> None:
        self.log = log_dir / f"edge-{i}.log"
        with open(self.log, "w") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "coinfer.edge.daemon",
                    "--model",
                    str(draft),
                    "--cloud",
                    f"127.0.0.1:{cloud_port}",
                    "--token-file",
                    str(token_file),
                    "--grpc-port",
                    "0",
                    "--http-port",
                    "0",
                    "--no-probe-on-start",
                    "--plan",
                    "split",
                    "--threads",
                    "1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.http_port = 0

    async def ready(self, timeout_s: float = 180.0) -> None:
        """Wait for ``HTTP n`` on stdout, then for /healthz to show the cloud replica serving (else the
        first requests would be edge-only answers, not load on the cloud)."""
        t0 = time.monotonic()
        while not self.http_port:
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge exited with {self.proc.returncode} (log {self.log})")
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"edge: no HTTP port after {timeout_s:.0f} s (log {self.log})")
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith("HTTP "):
                    self.http_port = int(line.split()[1])
            await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as c:
            while time.monotonic() - t0 < timeout_s:
                st = (await c.get("/healthz")).json()
                if st.get("cloud_serving") and any(r["serving"] for r in st.get("replicas", [])):
                    return
                await asyncio.sleep(0.5)
        raise TimeoutError(f"edge: cloud not serving after {timeout_s:.0f} s (log {self.log})")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def stop(self) -> None:
        """SIGTERM the group (the daemon finishes in-flight requests), SIGKILL after 15 s."""
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass


def tree_usage(pids: list[int]) -> dict[str, tuple[float, float, float, int]]:
    """``{"name-pid": (RSS, PSS, USS MB, open descriptors)}`` for each pid and all its descendants.
    PSS splits shared pages between their processes, so its sum is the tree's real footprint; USS
    (pages only this process maps) is where a leak shows, and unlike RSS it does not drop when the
    kernel evicts shared library pages because another workload on the box needs memory."""
    out: dict[str, tuple[float, float, float, int]] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                mem = p.memory_full_info()  # smaps_rollup: cheap enough every few seconds
                out[f"{p.name()}-{p.pid}"] = (mem.rss / 2**20, mem.pss / 2**20, mem.uss / 2**20, p.num_fds())
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # a child that just exited
                pass
    return out


async def cloud_active(port: int, token: str) -> int:
    """The cloud's Status.active_sessions (-1 when it does not answer)."""
    from coinfer.v1 import coinfer_pb2, coinfer_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            st = await coinfer_pb2_grpc.CoinferCloudStub(ch).Status(
                coinfer_pb2.StatusRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=5
            )
            return st.active_sessions
        except grpc.aio.AioRpcError:
            return -1


async def one(client: httpx.AsyncClient, url: str, body: dict, timeout_s: float) -> Result:
    r = Result(time.monotonic(), stream=body["stream"])
    try:
        async with asyncio.timeout(timeout_s), client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            r.status = resp.status_code
            if resp.status_code != 200:
                r.kind, r.body = f"http_{resp.status_code}", (await resp.aread())[:400].decode(errors="replace")
            elif not body["stream"]:
                info = json.loads(await resp.aread())["coinfer"]
                r.kind, r.source, r.fallback = "ok", info["source"], info["fallback_reason"]
            else:  # SSE: the final chunk carries the result; [DONE] must follow
                last, done = None, False
                async for line in resp.aiter_lines():
                    r.events += bool(line)
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        payload = json.loads(line[6:])
                        if payload.get("choices", [{}])[0].get("finish_reason") == "stop":
                            last = payload.get("coinfer", {})
                if done and last is not None:
                    r.kind, r.source, r.fallback = "ok", last["source"], last["fallback_reason"]
                else:
                    r.kind = "incomplete_stream"
    except TimeoutError:
        r.kind = "client_timeout"
    except Exception as exc:  # noqa: BLE001 - every failure is an outcome to count
        # httpx's transport errors often have an empty message: the cause says what the socket saw
        r.kind, r.body = type(exc).__name__, f"{exc!r} <- {exc.__context__!r}"[:400]
    r.end = time.monotonic()
    return r


async def drive(args: argparse.Namespace, cloud: Replica, edges: list[Edge], token0: str) -> dict:
    await cloud.serving()
    await asyncio.gather(*(e.ready() for e in edges))
    async with httpx.AsyncClient(timeout=10) as c:
        model = (await c.get(f"{edges[0].url}/v1/models")).json()["data"][0]["id"]
    prompts = itertools.cycle(_problems(500, seed=7))
    counter = itertools.count()
    results: list[Result] = []
    samples: list[Sample] = []
    in_flight = 0
    timeout_s = (args.deadline_ms or 30_000) / 1e3 + 60  # well past the edge's own deadline: a hang
    trees = {"cloud": [cloud.proc.pid], "edge": [e.proc.pid for e in edges]}

    async def sample(t0: float) -> Sample:
        usage = {k: await asyncio.to_thread(tree_usage, pids) for k, pids in trees.items()}
        total = {k: [sum(v[i] for v in u.values()) for i in range(4)] for k, u in usage.items()}
        rss, pss, uss = ({k: round(v[i], 1) for k, v in total.items()} for i in range(3))
        return Sample(
            round(time.monotonic() - t0, 1),
            rss,
            pss,
            uss,
            {k: v[3] for k, v in total.items()},
            {f"{k}/{name}": round(v[2], 1) for k, u in usage.items() for name, v in u.items()},
            await cloud_active(cloud.port, token0),
            in_flight,
            len(results),
        )

    # one pool for all clients, sized to the concurrency: connections are reused, never queued for
    # keepalive_expiry below uvicorn's 5 s keep-alive: with both at 5 s (httpx's default) a spare
    # pooled connection is sometimes reused just as the edge closes it (ReadError, no response:
    # a client-side race, seen once in 2,343 requests), which is not what this soak measures
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency, keepalive_expiry=2.0
    )
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s)) as client:
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        samples.append(await sample(t0))

        async def worker(w: int) -> None:
            nonlocal in_flight
            # a worker sticks to one edge: each edge then has exactly concurrency / edges requests in
            # flight, within the cloud's per-edge quota (round robin per request could put 33 on one)
            edge = edges[w % len(edges)]
            while time.monotonic() < end:
                i = next(counter)
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": next(prompts)}],
                    "stream": i % 2 == 0,
                    "max_tokens": (48, 64, 96)[i % 3],
                    "temperature": 0.3,
                    "coinfer": {"plan": "split", **({"deadline_ms": args.deadline_ms} if args.deadline_ms else {})},
                }
                in_flight += 1
                try:
                    results.append(await one(client, edge.url, body, timeout_s))
                finally:
                    in_flight -= 1

        async def sampler() -> None:
            while time.monotonic() < end:
                await asyncio.sleep(min(args.sample_s, max(0.0, end - time.monotonic())))
                samples.append(await sample(t0))
                s = samples[-1]
                print(
                    f"[{s.t:6.0f} s] "
                    + " | ".join(
                        f"{k} RSS {s.rss_mb[k]:7.1f} USS {s.uss_mb[k]:7.1f} MB {s.fds[k]:4d} fds" for k in trees
                    )
                    + f" | sessions {s.active_sessions:3d} | in flight {s.in_flight:3d} | done {s.done}",
                    file=sys.stderr,
                    flush=True,
                )

        await asyncio.gather(sampler(), *(worker(w) for w in range(args.concurrency)))
        load_s = time.monotonic() - t0
    await asyncio.sleep(3)  # sessions close, keep-alive connections are gone
    drained = await sample(t0)
    return report(args, results, samples, drained, load_s, t0)


def growth(samples: list[Sample], key: str, tree: str) -> dict:
    """Last 3 samples vs the first 3 after warm-up: ratio - 1, and the absolute change."""
    vals = [getattr(s, key)[tree] for s in samples]
    if len(vals) < 2:
        return {}
    first, last = statistics.mean(vals[:3]), statistics.mean(vals[-3:])
    return {
        "first": round(first, 1),
        "last": round(last, 1),
        "abs": round(last - first, 1),
        "ratio": round(last / first - 1, 4) if first else None,
        "overlap": len(vals) < 6,
    }


def report(
    args: argparse.Namespace, results: list[Result], samples: list[Sample], drained: Sample, load_s: float, t0: float
) -> dict:
    run_s = args.minutes * 60
    warmup_s = max(0.2 * run_s, 60.0) if run_s >= 300 else 0.2 * run_s
    post = [s for s in samples if s.t >= warmup_s]
    ok = [r for r in results if r.kind == "ok"]
    ok_post = [r for r in ok if r.start - t0 >= warmup_s]
    errors = Counter(r.kind for r in results if r.kind != "ok")
    examples: dict[str, str] = {}
    for r in results:
        if r.kind != "ok" and r.kind not in examples:
            examples[r.kind] = r.body
    return {
        "config": {
            "minutes": args.minutes,
            "concurrency": args.concurrency,
            "edges": args.edges,
            "sample_s": args.sample_s,
            "deadline_ms": args.deadline_ms or "edge default (30000)",
            "cpus": os.cpu_count(),
        },
        "warmup_s": round(warmup_s, 1),
        "load_s": round(load_s, 1),
        "samples_after_warmup": len(post),
        "rss_growth": {tree: growth(post, "rss_mb", tree) for tree in ("cloud", "edge")},
        "pss_growth": {tree: growth(post, "pss_mb", tree) for tree in ("cloud", "edge")},
        "uss_growth": {tree: growth(post, "uss_mb", tree) for tree in ("cloud", "edge")},
        "uss_growth_by_proc": {
            name: growth(post, "uss_by_proc", name)["ratio"]
            for name in post[-1].uss_by_proc
            if all(name in x.uss_by_proc for x in post)
        }
        if len(post) > 1
        else {},
        "fd_growth": {tree: growth(post, "fds", tree) for tree in ("cloud", "edge")},
        "drained": asdict(drained),
        "requests": len(results),
        "ok": len(ok),
        "errors": dict(errors),
        "error_examples": examples,
        "failures": [
            {
                "kind": r.kind,
                "t_s": round(r.start - t0, 1),
                "ms": round(r.ms),
                "stream": r.stream,
                "status": r.status,
                "sse_lines": r.events,
                "body": r.body[:200],
            }
            for r in results
            if r.kind != "ok"
        ][:30],
        "sources": dict(Counter(r.source for r in ok)),
        "edge_only_reasons": Counter(r.fallback[:80] for r in ok if r.source == "edge_only").most_common(5),
        "latency_ms": {
            "p50": round(_pct([r.ms for r in ok], 0.5)),
            "p95": round(_pct([r.ms for r in ok], 0.95)),
            "p50_after_warmup": round(_pct([r.ms for r in ok_post], 0.5)),
            "p95_after_warmup": round(_pct([r.ms for r in ok_post], 0.95)),
        },
        "throughput_rps": round(len(results) / load_s, 3) if load_s else 0.0,
        "ok_rps": round(len(ok) / load_s, 3) if load_s else 0.0,
        "samples": [asdict(s) for s in samples],
    }


def table(rep: dict) -> str:
    rows = [
        f"{'tree':6} {'RSS first MB':>13} {'last MB':>9} {'growth':>8} {'USS growth':>11} "
        f"{'fds first':>10} {'last':>6} {'growth':>8}"
    ]
    for tree in ("cloud", "edge"):
        r, p, f = rep["rss_growth"][tree], rep["uss_growth"][tree], rep["fd_growth"][tree]
        rows.append(
            f"{tree:6} {r.get('first', 0):13.1f} {r.get('last', 0):9.1f} {r.get('ratio') or 0:8.2%} "
            f"{p.get('ratio') or 0:11.2%} {f.get('first', 0):10.1f} {f.get('last', 0):6.1f} "
            f"{f.get('ratio') or 0:8.2%}"
        )
    lat = rep["latency_ms"]
    rows.append(f"requests {rep['requests']} ok {rep['ok']} errors {rep['errors'] or 0} sources {rep['sources']}")
    rows.append(
        f"latency p50 {lat['p50']} ms p95 {lat['p95']} ms; {rep['throughput_rps']} req/s; after drain: "
        f"sessions {rep['drained']['active_sessions']} fds {rep['drained']['fds']}"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument(
        "--edges",
        type=int,
        default=0,
        help="edge daemons; 0 = one per 32 requests in flight (the cloud's per-edge session quota)",
    )
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--deadline-ms", type=int, default=0, help="per-request deadline; 0 = the edge's default")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/coinfer-soak"))
    args = ap.parse_args(argv)
    args.edges = args.edges or max(1, math.ceil(args.concurrency / 32))
    args.log_dir.mkdir(parents=True, exist_ok=True)
    # SIGTERM -> SystemExit, so the finally below still stops the children
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from coinfer.demo.artifacts import ensure_artifacts

    art = ensure_artifacts()
    tokens = {f"soak-edge-{i}": secrets.token_hex(16) for i in range(args.edges)}
    token_path = args.log_dir / "tokens.json"
    token_path.write_text(json.dumps(tokens))
    token_files = []
    for name, tok in tokens.items():
        token_files.append(args.log_dir / f"{name}.token")
        token_files[-1].write_text(tok)
    # a repeated flag's last value wins: this soak's engine size and bearer tokens over Replica's defaults
    cloud = Replica(
        art.target,
        free_ports(1)[0],
        args.log_dir,
        grace_s=5.0,
        extra=("--engine.max-num-seqs", str(max(16, args.concurrency)), "--auth-tokens", str(token_path)),
    )
    edges: list[Edge] = []
    try:
        cloud.start()
        edges = [Edge(i, art.draft_int8, cloud.port, f, args.log_dir) for i, f in enumerate(token_files)]
        rep = asyncio.run(drive(args, cloud, edges, next(iter(tokens.values()))))
    finally:
        for e in edges:
            e.stop()
        cloud.stop()
    print(json.dumps({k: v for k, v in rep.items() if k != "samples"}, indent=2))
    print(table(rep))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rep, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
