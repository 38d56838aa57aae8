"""Fault campaign: real processes and engines, faults injected, one command.

    python -m benchmarks.faults [--short] [--out docs/faults] [--hostile-examples 10000]

One cloud replica (``python -m coinfer.cloud.server``: vLLM on CPU) serves every scenario, in this order:

- ``slow_clients``: gRPC Session streams that never send ``SessionOpen``, and HTTP connections to an
  edge daemon that stay idle or trickle their request head; a prober measures the cloud's ``Status``
  and the edge's ``/healthz`` meanwhile.
- ``abandoned``: sessions opened and dropped by their client; the cloud's active count returns to 0.
- ``oversized``: messages and bodies over the limits.
- ``artefacts``: a tampered and a truncated draft model, wrong-shaped state files.
- ``edge_kill``: an edge daemon SIGKILLed with sessions open at the cloud.
- ``engine_hang``: the engine process SIGSTOPped under load; the heartbeat restarts it.
- ``cloud_kill``: the server (its pid alone) SIGKILLed under load from several edges, then restarted:
  requests lost or hung, processes left 5 s after the kill, edges back on split after SERVING.
- ``drain``: SIGTERM under load; in-flight sessions finish, the process exits within its grace.
- ``hostile`` (full run only): generated hostile inputs, ``benchmarks.hostile``.

``--short`` is the CI form (tests/integration/test_faults.py). The report is written to
``<out>/report.json`` and ``<out>/report.md``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2

from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc
from scenarios.fault_parts import (
    EdgeProcess,
    Load,
    Probes,
    descendants,
    health,
    still_alive,
    wait_health,
    watch_exit,
)
from scenarios.replicas import Replica, free_ports

TRACKER_GUARD_S = 60.0
"""How long multiprocessing's resource tracker may take to end after a SIGKILLed server: a hang guard (it ends in
under a second on a quiet machine; over 15 s once under a CI run with both cores loaded, at nice 5 then)."""

DRAIN_GUARD_S = 30.0
"""How long a drained server's engine processes may outlive it: a hang guard (measured on a quiet machine: see
docs/tests.md)."""

SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class Sizes:
    edges: int = 3
    concurrency: int = 6
    load_s: float = 40.0
    """Load phase around each kill / hang / drain."""
    slow_streams: int = 200
    idle_connections: int = 300
    abandoned: int = 1000
    open_timeout_s: float = 10.0
    """The cloud's ``limits.open_timeout_s``: how long the silent streams of ``slow_clients`` live."""
    heartbeat_timeout_s: float = 10.0
    """The cloud's ``heartbeat_timeout_s`` (period 1 s): how soon ``engine_hang`` is detected."""

    @classmethod
    def short(cls) -> Sizes:
        return cls(
            edges=2,
            concurrency=4,
            load_s=9.0,
            slow_streams=40,
            idle_connections=60,
            abandoned=100,
            open_timeout_s=3.0,
            heartbeat_timeout_s=5.0,
        )


class Campaign:
    def __init__(self, sizes: Sizes, work: Path) -> None:
        from coinfer.demo.artifacts import ensure_artifacts

        self.sizes, self.work = sizes, work
        self.art = ensure_artifacts()
        self.replica = Replica(
            self.art.target,
            free_ports(1)[0],
            work,
            grace_s=5.0,
            extra=(
                "--heartbeat-period-s",
                "1",
                "--heartbeat-timeout-s",
                str(sizes.heartbeat_timeout_s),
                "--limits.open-timeout-s",
                str(sizes.open_timeout_s),
            ),
        )
        self.cloud = f"127.0.0.1:{self.replica.port}"

    async def _status(self) -> pb.StatusResponse:
        async with grpc.aio.insecure_channel(self.cloud) as ch:
            return await pb_grpc.CoinferCloudStub(ch).Status(pb.StatusRequest(), timeout=2)

    async def _edges(self, n: int) -> list:
        from coinfer.edge.config import EdgeConfig
        from coinfer.edge.service import EdgeCore

        cores = []
        for _ in range(n):
            core = EdgeCore(
                EdgeConfig(
                    model=str(self.art.draft_int8),
                    cloud=self.cloud,
                    probe_on_start=False,
                    grpc_port=-1,
                    http_port=-1,
                    deadline_ms=20_000,
                    plan="split",
                )
            )
            await core.start()
            cores.append(core)
        for _ in range(200):
            if all(c.link.serving for c in cores):
                break
            await asyncio.sleep(0.05)
        return cores

    # ---- scenarios -------------------------------------------------------------------------------

    async def slow_clients(self) -> dict:
        """Streams that never open, idle and trickling HTTP connections; probes meanwhile."""
        s = self.sizes
        edge = await EdgeProcess(
            self.art.draft_int8, self.cloud, self.work / "edge-slow.log", "--http-header-timeout-s", "3"
        ).ready()
        try:
            async with grpc.aio.insecure_channel(self.cloud) as ch:
                stub = pb_grpc.CoinferCloudStub(ch)

                async def nothing():
                    await asyncio.sleep(3600)
                    yield pb.EdgeMessage()

                async def silent() -> str:
                    try:
                        async for _ in stub.Session(nothing(), timeout=60):
                            pass
                        return "OK"
                    except grpc.aio.AioRpcError as exc:
                        return exc.code().name

                async with Probes(self.cloud, f"http://127.0.0.1:{edge.http}/healthz") as probes:
                    conns = [await asyncio.open_connection("127.0.0.1", edge.http) for _ in range(s.idle_connections)]
                    for i, (_, w) in enumerate(conns):
                        if i % 2:
                            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")  # a slow head
                    t0 = time.monotonic()
                    codes = Counter(await asyncio.gather(*(silent() for _ in range(s.slow_streams))))
                    streams_s = time.monotonic() - t0
                    closed = 0
                    for r, w in conns:
                        try:
                            closed += await asyncio.wait_for(r.read(), 10) == b""
                        except TimeoutError:
                            pass
                        w.close()
                    active = (await self._status()).active_sessions
                return {
                    "silent_streams": s.slow_streams,
                    "silent_stream_codes": dict(codes),
                    "silent_streams_ended_s": round(streams_s, 1),
                    "cloud_active_after": active,
                    "idle_or_slow_http_connections": s.idle_connections,
                    "closed_by_edge": closed,
                    "cloud_status": probes.result["cloud Status"],
                    "edge_healthz": probes.result["edge /healthz"],
                }
        finally:
            edge.kill()

    async def abandoned(self) -> dict:
        """Sessions opened with a valid SessionOpen and a draft, then dropped by the client."""
        n, codes = self.sizes.abandoned, Counter()
        open_msg = pb.EdgeMessage(
            open=pb.SessionOpen(problem=pb.Problem(prompt=self.prompts_one()), deadline_ms=30_000, expected_drafts=3)
        )
        async with Probes(self.cloud) as probes:
            for batch in range(0, n, 50):
                async with grpc.aio.insecure_channel(self.cloud) as ch:
                    stub = pb_grpc.CoinferCloudStub(ch)
                    calls = []
                    for _ in range(min(50, n - batch)):
                        call = stub.Session(timeout=30)
                        await call.write(open_msg)
                        calls.append(call)

                    async def first_reply(call) -> str:
                        try:
                            await asyncio.wait_for(call.read(), 10)
                            return "accepted"
                        except TimeoutError:
                            return "no answer in 10 s"
                        except grpc.aio.AioRpcError as exc:
                            return exc.code().name

                    # all 50 answered before any is dropped: past the per-edge quota (32) some are refused
                    codes.update(await asyncio.gather(*(first_reply(c) for c in calls)))
                    for call in calls:
                        call.cancel()
            t0 = time.monotonic()
            while (await self._status()).active_sessions and time.monotonic() - t0 < 30:
                await asyncio.sleep(0.1)
            freed_s = time.monotonic() - t0
            active = (await self._status()).active_sessions
        return {
            "abandoned": n,
            "first_reply": dict(codes),
            "active_after": active,
            "freed_within_s": round(freed_s, 2),
            "cloud_status": probes.result["cloud Status"],
        }

    def prompts_one(self) -> str:
        return "If x=2 and y=3, compute x*y+x."

    async def oversized(self) -> dict:
        out = {}
        async with grpc.aio.insecure_channel(self.cloud, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            stub = pb_grpc.CoinferCloudStub(ch)
            for name, call in (
                ("Probe 20 MB payload", lambda: stub.Probe(pb.ProbeRequest(payload=b"x" * (20 << 20)), timeout=10)),
                ("Probe 1 GB answer", lambda: stub.Probe(pb.ProbeRequest(response_bytes=1 << 30), timeout=10)),
                (
                    "Generate 1 MB prompt",
                    lambda: stub.Generate(
                        pb.GenerateRequest(problem=pb.Problem(prompt="x" * (1 << 20))), timeout=10
                    ).read(),
                ),
            ):
                try:
                    await call()
                    out[name] = "OK"
                except grpc.aio.AioRpcError as exc:
                    out[name] = exc.code().name
        edge = await EdgeProcess(self.art.draft_int8, self.cloud, self.work / "edge-big.log").ready()
        try:
            async with httpx.AsyncClient() as http:
                r = await http.post(
                    f"http://127.0.0.1:{edge.http}/v1/chat/completions",
                    content=b"{" * (2 << 20),
                    headers={"content-type": "application/json"},
                    timeout=30,
                )
                out["HTTP 2 MB body"] = r.status_code
        finally:
            edge.kill()
        return out

    async def artefacts(self) -> dict:
        """A tampered and a truncated draft model, wrong-shaped state files, on the real daemon."""
        out = {}
        for kind in ("tampered", "truncated"):
            d = self.work / f"draft-{kind}"
            shutil.copytree(self.art.draft_int8, d, dirs_exist_ok=True)
            onnx = d / "model.onnx"
            data = bytearray(onnx.read_bytes())
            if kind == "tampered":
                data[len(data) // 2] ^= 0xFF
            else:
                data = data[: len(data) // 2]
            onnx.write_bytes(bytes(data))
            state = self.work / f"planner-{kind}.json"
            state.write_text('{"values": []}')
            lazy = await EdgeProcess(
                d,
                self.cloud,
                self.work / f"edge-{kind}.log",
                "--no-warm",
                "--plan",
                "edge",
                "--planner-state",
                str(state),
            ).ready()
            try:
                async with httpx.AsyncClient() as http:
                    r = await http.post(
                        f"http://127.0.0.1:{lazy.http}/v1/completions",
                        timeout=60,
                        json={"model": "coinfer-edge", "prompt": self.prompts_one(), "max_tokens": 8},
                    )
                    health = (await http.get(f"http://127.0.0.1:{lazy.http}/healthz", timeout=5)).status_code
                out[f"{kind}: lazy edge request"] = {
                    "status": r.status_code,
                    "body": r.json()["error"]["message"],
                    "healthz": health,
                }
            finally:
                lazy.kill()
            out[f"{kind}: bad planner state set aside"] = any(
                p.name.startswith(f"{state.name}.invalid-") for p in self.work.iterdir()
            )
            warm = EdgeProcess(d, self.cloud, self.work / f"edge-{kind}-warm.log")
            rc = await asyncio.to_thread(warm.proc.wait, 120)
            tail = [ln for ln in warm.log.read_text().splitlines() if "model.onnx" in ln][-1:]
            out[f"{kind}: warm edge start"] = {"exit": rc, "names": tail[0][-160:] if tail else ""}
        return out

    async def edge_kill(self) -> dict:
        edge = await EdgeProcess(self.art.draft_int8, self.cloud, self.work / "edge-kill.log").ready()
        http = httpx.AsyncClient()
        body = {
            "model": "coinfer-edge",
            "messages": [{"role": "user", "content": self.prompts_one()}],
            "coinfer": {"plan": "split", "num_drafts": 4},
        }

        async def client() -> None:  # back to back: an arith split answers in ~50 ms, its session with it
            while True:
                await http.post(f"http://127.0.0.1:{edge.http}/v1/chat/completions", json=body, timeout=60)

        reqs = [asyncio.create_task(client()) for _ in range(4)]
        try:
            t0 = time.monotonic()
            # killed on the poll that saw sessions open (a second poll found them all ended: CI, 2026-12-05)
            while (open_at_kill := (await self._status()).active_sessions) == 0 and time.monotonic() - t0 < 60:
                await asyncio.sleep(0.02)
            edge.kill()
            t1 = time.monotonic()
            while (await self._status()).active_sessions and time.monotonic() - t1 < 60:
                await asyncio.sleep(0.02)
            freed = time.monotonic() - t1
            return {
                "sessions_open_at_kill": open_at_kill,
                "freed_s": round(freed, 2),
                "cloud_active_after": (await self._status()).active_sessions,
                "cloud_health_after": health_pb2.HealthCheckResponse.ServingStatus.Name(
                    await health(self.replica.port)
                ),
            }
        finally:
            for r in reqs:
                r.cancel()
            await asyncio.gather(*reqs, return_exceptions=True)
            await http.aclose()

    async def engine_hang(self, cores: list) -> dict:
        core_proc = next(p for p in descendants(self.replica.proc.pid) if "EngineCore" in p.name())
        load = Load(cores, self.sizes.concurrency).start()
        await asyncio.sleep(self.sizes.load_s / 3)
        start = time.monotonic()
        core_proc.send_signal(signal.SIGSTOP)
        not_serving = await wait_health(self.replica.port, health_pb2.HealthCheckResponse.NOT_SERVING, 120)
        serving = not_serving + await wait_health(self.replica.port, SERVING, 600)
        await asyncio.sleep(self.sizes.load_s / 3)
        await load.stop()
        return {
            "not_serving_after_s": round(not_serving, 1),
            "serving_again_after_s": round(serving, 1),
            "hung_engine_process_left": bool(still_alive([core_proc])),
            **load.summary(start),
        }

    async def cloud_kill(self, cores: list) -> dict:
        load = Load(cores, self.sizes.concurrency).start()
        await asyncio.sleep(self.sizes.load_s / 3)
        procs = descendants(self.replica.proc.pid)
        start = time.monotonic()
        os.kill(self.replica.proc.pid, signal.SIGKILL)  # the server alone: its engine must follow by itself
        self.replica.proc.wait()
        # the engine follows through PR_SET_PDEATHSIG: what is left at 5 s is named, at 15 s killed; the resource
        # tracker alone gets TRACKER_GUARD_S (under a CI run with both cores loaded it took over 15 s)
        ended = await watch_exit(procs, start, note_at_s=5.0, bound_s=15.0, guard_s=TRACKER_GUARD_S)
        self.replica.start()
        await wait_health(self.replica.port, SERVING, 600)
        serving_at = time.monotonic()
        back: list[float] = []
        for c in cores:  # each edge: serving replica seen and breaker closed -> its planner picks split again
            while not (c.link.serving and c.link.breaker.state == "closed") and time.monotonic() - serving_at < 60:
                await asyncio.sleep(0.02)
            back.append(time.monotonic() - serving_at)
        await asyncio.sleep(self.sizes.load_s / 3)
        await load.stop()
        first_cloud = min(
            (o.start for o in load.outcomes if o.start >= serving_at and o.ok and o.source != "edge_only"), default=None
        )
        return {
            "processes_before_kill": len(procs),
            "processes_left_15s_after_kill": len(ended["left"]),
            "all_gone_after_s": ended["all_gone_after_s"],
            "resource_tracker_gone_after_s": ended["resource_tracker_gone_after_s"],
            "left_at_5s": ended["left_at_note"],
            "left": ended["left"],
            "restart_to_serving_s": round(serving_at - start - 5.0, 1),
            "edges_back_on_split_after_serving_s": [round(b, 2) for b in back],
            "first_cloud_answer_started_after_serving_s": round(first_cloud - serving_at, 2) if first_cloud else None,
            **load.summary(start),
        }

    async def drain(self, cores: list) -> dict:
        load = Load(cores, self.sizes.concurrency).start()
        await asyncio.sleep(self.sizes.load_s / 3)
        start = time.monotonic()
        procs = descendants(self.replica.proc.pid)
        self.replica.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.replica.proc.wait, 120)
        exit_s = time.monotonic() - start
        # the engine's processes end with the server's drain; under a CI run with both cores loaded two were still
        # alive 2 s after an exit that took 22.6 s: they are named at 2 s and must end within DRAIN_GUARD_S
        ended = await watch_exit(procs, time.monotonic(), note_at_s=2.0, bound_s=DRAIN_GUARD_S, guard_s=DRAIN_GUARD_S)
        await asyncio.sleep(self.sizes.load_s / 3)
        await load.stop()
        # a normal drain is not an error: no "ERROR ... output_handler failed ... EngineDeadError"
        log = (self.replica.log_dir / f"cloud-{self.replica.port}-{self.replica.starts}.log").read_text(
            errors="replace"
        )
        return {
            "exit_after_sigterm_s": round(exit_s, 1),
            "grace_s": self.replica.grace_s,
            "exit_code": self.replica.proc.returncode,
            "processes_left_after_exit": len(ended["left"]),
            "all_gone_after_exit_s": ended["all_gone_after_s"],
            "left_2s_after_exit": ended["left_at_note"],
            "left": ended["left"],
            "engine_dead_errors_logged": log.count("output_handler failed") + log.count("EngineDeadError"),
            **load.summary(start),
        }

    async def run(self, hostile_examples: int = 0) -> dict:
        report: dict = {"sizes": self.sizes.__dict__}
        t0 = time.monotonic()
        ours_before = {p.pid for p in descendants(os.getpid())}  # e.g. a test session's own engine: not ours
        self.replica.start()
        cores: list = []
        try:
            await self.replica.serving()
            for name in ("slow_clients", "abandoned", "oversized", "artefacts", "edge_kill"):
                report[name] = await getattr(self, name)()
                print(name, json.dumps(report[name]), flush=True)
            cores = await self._edges(self.sizes.edges)
            for name in ("engine_hang", "cloud_kill", "drain"):
                report[name] = await getattr(self, name)(cores)
                print(name, json.dumps(report[name]), flush=True)
        finally:
            for c in cores:
                await c.close()
            self.replica.stop()
            for p in still_alive(descendants(os.getpid())):  # nothing the campaign started may outlive it
                if p.pid not in ours_before:
                    p.kill()
        if hostile_examples:
            from benchmarks import hostile

            report["hostile"] = await hostile.run(examples=hostile_examples)
        report["wall_s"] = round(time.monotonic() - t0, 1)
        return report


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [
        "# Fault campaign",
        "",
        f"`python -m benchmarks.faults` — wall time {report['wall_s']} s, sizes {report['sizes']}.",
        "",
    ]
    for name, res in report.items():
        if isinstance(res, dict) and name != "sizes":
            lines += [f"## {name}", "", "| measure | value |", "|---|---|"]
            lines += [f"| {k} | {json.dumps(v, default=str)} |" for k, v in res.items()]
            lines.append("")
    (out / "report.md").write_text("\n".join(lines))
