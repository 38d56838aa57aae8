"""Many edges, many cloud replicas, and faults during a bounded load run.

    .venv/bin/python -m benchmarks.replicas [--replicas 3] [--edges 4] [--requests 300] [--concurrency 8] [--json]

Starts ``--replicas`` real cloud services (``python -m coinfer.cloud.server``: vLLM on CPU with the demo
target, each its own process group on a fixed loopback port) and ``--edges`` edge cores in this
process, each with its own gRPC channel over all replicas (``cloud = "IP:port,IP:port,..."``:
round_robin with client-side health checks). Sends ``--requests`` held-out problems with the
``split`` plan, ``--concurrency`` at a time spread over the edges. After 30% of them have finished,
replica 0 is SIGKILLed (process group: its vLLM engine too); after 55%, replica 1 gets SIGTERM (it
drains: NOT_SERVING, in-flight sessions finish) and is restarted on its port once it has exited (a
rolling update). Reports, measured in this one run:

- requests lost (an error reached the caller) or hung (past the deadline): the goal is 0;
- edge-only answers (no replica answered; goal <= 1%) and sessions replayed on another replica;
- drafting rounds started from scratch per request (a replay re-sends the drafts: goal 1 each);
- sessions per replica in the steady phase (before the kill) vs an even share (goal +-20%);
- p50 / p95 latency in the steady phase and during the disturbance (kill until the restarted replica
  serves again); goal: disturbed p95 <= 2x steady.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

CLOUD_SERVICE = "coinfer.v1.CoinferCloud"


@dataclass
class Scenario:
    replicas: int = 3
    edges: int = 4
    requests: int = 300
    concurrency: int = 8
    kill_at: float = 0.30
    """Fraction of requests finished when replica 0 is SIGKILLed (0 = never)."""
    drain_at: float = 0.55
    """Fraction finished when replica 1 is drained and restarted (0 = never)."""
    deadline_ms: int = 120_000
    grace_s: float = 10.0
    seed: int = 0


@dataclass
class Outcome:
    index: int
    edge: int
    start: float
    end: float = 0.0
    ok: bool = False
    error: str = ""
    source: str = ""
    fallback: str = ""
    replays: list[str] = field(default_factory=list)
    replica: str = ""
    drafting_rounds: int = 0
    """Drafting rounds that started at draft 0 (a re-drafted request would show 2)."""

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1e3


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


START_GUARD_S = 600.0
"""How long a replica may take to say SERVING: a hang guard. Three replicas starting together on 2 cores were all
serving after 45 s on a quiet machine (a restarted one: 25 s); with both cores loaded by two busy loops one was not
after 300 s, the bound before (docs/tests.md)."""


class Replica:
    """One ``python -m coinfer.cloud.server`` process group on a fixed port."""

    def __init__(
        self, model: Path, port: int, log_dir: Path, grace_s: float, extra: tuple[str, ...] = (), cpus: str = ""
    ) -> None:
        self.model, self.port, self.log_dir, self.grace_s, self.extra = model, port, log_dir, grace_s, extra
        self.cpus = cpus
        """CPU ids for the engine's threads (``VLLM_CPU_OMP_THREADS_BIND``, e.g. ``"1"`` or ``"0-3"``); empty =
        vLLM's automatic binding, which assumes one replica per host: every replica's engine on the same
        cores (3 replicas on 2 cores: start 70-85 s, 50-65 s spread over both)."""
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"cloud-{self.port}-{self.starts}.log", "w")  # noqa: SIM115 - the child owns it
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
        if self.cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpus
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "coinfer.cloud.server",
                "--engine.model",
                str(self.model),
                "--port",
                str(self.port),
                "--grace-s",
                str(self.grace_s),
                "--engine.max-num-seqs",
                "16",
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    async def serving(self, timeout_s: float = START_GUARD_S) -> None:
        """Wait until its health says SERVING (the engine is loaded and warm); an exit ends the wait at once."""
        t0 = time.monotonic()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() - t0 < timeout_s:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"replica :{self.port} exited with {self.proc.returncode} (log in {self.log_dir})"
                    )
                try:
                    r = await stub.Check(health_pb2.HealthCheckRequest(service=CLOUD_SERVICE), timeout=2)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.5)
        raise TimeoutError(f"replica :{self.port} not SERVING after {timeout_s:.0f} s")

    def kill(self) -> None:
        """SIGKILL the whole process group: the server and its vLLM engine process."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    async def drain_and_restart(self) -> float:
        """SIGTERM (drain), wait for the exit, start again on the same port; returns drain seconds."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        while self.proc.poll() is None:
            await asyncio.sleep(0.1)
        drained = time.monotonic() - t0
        try:  # the engine process may outlive its server by a moment
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.start()
        await self.serving()
        return drained

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()


def _problems(n: int, seed: int) -> list[str]:
    import random

    from coinfer.demo import wordprob
    from coinfer.tasks import problems

    rng = random.Random(seed)
    words, presets = wordprob.problems(rng, held_out=True), problems(rng, ("arith", "select"), held_out=True)
    return [next(words).prompt if i % 2 == 0 else next(presets).prompt for i in range(n)]


async def _one(core, edge: int, index: int, prompt: str, deadline_ms: int) -> Outcome:
    from coinfer import types as t
    from coinfer.edge.service import Done, SolveRequest

    out = Outcome(index, edge, time.monotonic())
    try:
        async with asyncio.timeout(deadline_ms / 1e3 + 30):  # hung = well past its own deadline
            async for ev in core.solve(
                SolveRequest(prompt=prompt, plan="split", deadline_ms=deadline_ms, request_id=f"r{index}")
            ):
                if isinstance(ev, t.Draft) and ev.index == 0:
                    out.drafting_rounds += 1
                elif isinstance(ev, Done):
                    r = ev.result
                    out.ok, out.source, out.fallback, out.replays = True, r.source, r.fallback_reason, list(r.replays)
                    out.replica = r.summary.replica if r.summary is not None else ""
    except TimeoutError:
        out.error = "hung"
    except Exception as exc:  # noqa: BLE001 - a lost request is what this measures
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    out.end = time.monotonic()
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def run(sc: Scenario, log_dir: Path) -> dict:
    from coinfer.demo.artifacts import ensure_artifacts
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.service import EdgeCore

    art = ensure_artifacts()
    ports = free_ports(sc.replicas)
    cpus = sorted(os.sched_getaffinity(0))  # several replicas on one host: each engine on its own core, in turn
    replicas = [Replica(art.target, p, log_dir, sc.grace_s, cpus=str(cpus[i % len(cpus)])) for i, p in enumerate(ports)]
    cores: list[EdgeCore] = []
    events: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        for r in replicas:
            r.start()
        await asyncio.gather(*(r.serving() for r in replicas))
        events["replicas_serving_s"] = time.monotonic() - t0
        cloud = ",".join(f"127.0.0.1:{p}" for p in ports)
        for _ in range(sc.edges):
            core = EdgeCore(
                EdgeConfig(
                    model=str(art.draft_int8),
                    cloud=cloud,
                    probe_on_start=False,
                    grpc_port=-1,
                    http_port=-1,
                    deadline_ms=sc.deadline_ms,
                    plan="split",
                )
            )
            await core.start()
            cores.append(core)
        for _ in range(200):  # every edge's monitors see every replica
            if all(sum(r.serving for r in c.link.replicas.values()) == sc.replicas for c in cores):
                break
            await asyncio.sleep(0.05)
        for c in cores:  # each edge's balanced channel is connected (its subchannels come up together)
            for _ in range(100):
                if c.link.channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        # what each edge's Status / healthz reports: every replica, serving
        events["replicas_serving_per_edge"] = min(sum(r["serving"] for r in c.status()["replicas"]) for c in cores)
        prompts = _problems(sc.requests, sc.seed)
        outcomes: list[Outcome] = []
        queue = list(enumerate(prompts))
        faults: list[asyncio.Task] = []
        start = time.monotonic()

        async def fault_driver() -> None:
            done = lambda: len(outcomes) / sc.requests  # noqa: E731
            if sc.kill_at:
                while done() < sc.kill_at:
                    await asyncio.sleep(0.05)
                replicas[0].kill()
                events["kill_at_s"] = time.monotonic() - start
            if sc.drain_at and sc.replicas > 1:
                while done() < sc.drain_at:
                    await asyncio.sleep(0.05)
                events["drain_at_s"] = time.monotonic() - start
                events["drain_s"] = await replicas[1].drain_and_restart()
                events["restarted_serving_at_s"] = time.monotonic() - start

        async def worker(w: int) -> None:
            while queue:
                i, prompt = queue.pop(0)
                outcomes.append(await _one(cores[i % sc.edges], i % sc.edges, i, prompt, sc.deadline_ms))

        faults.append(asyncio.create_task(fault_driver()))
        await asyncio.gather(*(worker(w) for w in range(sc.concurrency)))
        await asyncio.wait(faults, timeout=600)
        wall = time.monotonic() - start
    finally:
        for c in cores:
            await c.close()
        for r in replicas:
            r.stop()
    return report(sc, outcomes, events, start, wall)


def report(sc: Scenario, outcomes: list[Outcome], events: dict[str, float], start: float, wall: float) -> dict:
    lost = [o for o in outcomes if not o.ok]
    edge_only = [o for o in outcomes if o.ok and o.source == "edge_only"]
    kill = start + events.get("kill_at_s", wall)
    back = start + events.get("restarted_serving_at_s", wall)
    steady = [o for o in outcomes if o.ok and o.end < kill]
    disturbed = [o for o in outcomes if o.ok and o.end >= kill and o.start <= back]
    per_replica = Counter(o.replica for o in steady if o.replica)
    even = len(steady) / sc.replicas if steady else 0.0
    spread = {k: round(v / even - 1, 3) for k, v in sorted(per_replica.items())} if even else {}
    p95_steady, p95_dist = _pct([o.ms for o in steady], 0.95), _pct([o.ms for o in disturbed], 0.95)
    return {
        "scenario": asdict(sc),
        "wall_s": round(wall, 1),
        "events_s": {k: round(v, 1) for k, v in events.items()},
        "requests": len(outcomes),
        "lost": len(lost),
        "lost_detail": [o.error for o in lost][:10],
        "edge_only": len(edge_only),
        "edge_only_share": round(len(edge_only) / max(1, len(outcomes)), 4),
        "edge_only_reasons": Counter(o.fallback[:60] for o in edge_only).most_common(5),
        "replayed": sum(bool(o.replays) for o in outcomes),
        "replay_reasons": Counter(r.split(":")[0] for o in outcomes for r in o.replays).most_common(5),
        "max_drafting_rounds": max((o.drafting_rounds for o in outcomes), default=0),
        "redrafted_after_replay": sum(o.drafting_rounds > 1 for o in outcomes if o.replays),
        "steady_sessions_per_replica": dict(per_replica),
        "steady_spread_vs_even": spread,
        "p50_ms": {
            "steady": round(statistics.median([o.ms for o in steady]), 0) if steady else 0.0,
            "disturbed": round(statistics.median([o.ms for o in disturbed]), 0) if disturbed else 0.0,
        },
        "p95_ms": {"steady": round(p95_steady, 0), "disturbed": round(p95_dist, 0)},
        "p95_disturbed_over_steady": round(p95_dist / p95_steady, 2) if p95_steady else None,
        "disturbed_requests": len(disturbed),
        "steady_requests": len(steady),
    }
