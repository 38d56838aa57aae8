"""The parts a fault campaign (``scenarios.faults``) drives: the probe process, edge daemons in their own
processes, gRPC health polls, a process tree's survivors, and the split load from in-process edges."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scenarios.replicas import Outcome, _one, _problems


class Probes:
    """``benchmarks.probe`` in its own process for the duration of a ``with`` block; ``result`` after it."""

    def __init__(self, cloud: str = "", http: str = "") -> None:
        self.args = [a for flag, v in (("--cloud", cloud), ("--http", http)) if v for a in (flag, v)]
        self.result: dict = {}

    async def __aenter__(self) -> Probes:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.probe",
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        await asyncio.sleep(1.0)  # its imports and first connections are not the server's delay
        return self

    async def __aexit__(self, *exc) -> None:
        out, _ = await self.proc.communicate(b"")
        self.result = json.loads(out.decode().strip().splitlines()[-1])


class EdgeProcess:
    """``python -m coinfer.edge.daemon`` in its own process group; ``http`` / ``grpc`` ports from its stdout."""

    def __init__(self, model: Path, cloud: str, log: Path, *flags: str) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "coinfer.edge.daemon",
                "--model",
                str(model),
                "--cloud",
                cloud,
                "--grpc-port",
                "0",
                "--http-port",
                "0",
                "--no-probe-on-start",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            start_new_session=True,
        )
        self.grpc = self.http = 0

    async def ready(self, timeout_s: float = 120.0) -> EdgeProcess:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            while not (self.grpc and self.http):
                line = await loop.run_in_executor(None, self.proc.stdout.readline)
                if not line:
                    raise RuntimeError(f"edge exited ({self.proc.poll()}); log: {self.log}")
                kind, _, port = line.partition(" ")
                if kind in ("GRPC", "HTTP"):
                    setattr(self, kind.lower(), int(port))
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)).status
        except grpc.aio.AioRpcError:
            return -1


async def wait_health(port: int, want: int, timeout_s: float) -> float:
    """Seconds until health is ``want`` (polled every 50 ms); raises TimeoutError."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await health(port) == want:
            return time.monotonic() - t0
        await asyncio.sleep(0.05)
    raise TimeoutError(f"health of :{port} not {want} within {timeout_s:.0f} s")


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def still_alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def is_resource_tracker(p: psutil.Process) -> bool:
    """Whether ``p`` is multiprocessing's resource tracker (``python -c 'from multiprocessing.resource_tracker
    import main; ...'``)."""
    try:
        return any("multiprocessing.resource_tracker" in part for part in p.cmdline())
    except psutil.Error:
        return False


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:100]}"
    except psutil.Error:
        return f"{p.pid} (gone)"


async def watch_exit(
    procs: list[psutil.Process], start: float, *, note_at_s: float, bound_s: float, guard_s: float
) -> dict:
    """Watch a dead server's process tree end on its own: the processes still alive ``note_at_s`` after
    ``start`` are named, any still alive at ``bound_s`` end the watch, except multiprocessing's resource tracker
    alone, which gets ``guard_s`` (it has no parent watch and ends once its pipe closes, after unlinking the
    shared memory vLLM left: killing it would leak that). What is left at the end is named and killed.

    Returns ``all_gone_after_s`` (None if something was left, or only the tracker lasted past ``bound_s``: then
    ``resource_tracker_gone_after_s``), ``left_at_note`` and ``left`` (names)."""
    gone_after, noted = None, []
    while time.monotonic() - start < guard_s:
        alive = still_alive(procs)
        if not alive:
            gone_after = time.monotonic() - start
            break
        if not noted and time.monotonic() - start >= note_at_s:
            noted = [describe(p) for p in alive]
        if time.monotonic() - start >= bound_s and not all(is_resource_tracker(p) for p in alive):
            break
        await asyncio.sleep(0.25)
    left = still_alive(procs)
    names = [describe(p) for p in left]
    for p in left:
        p.kill()
    tracker_after = None
    if gone_after is not None and gone_after >= bound_s:
        tracker_after, gone_after = gone_after, None
    return {
        "all_gone_after_s": round(gone_after, 2) if gone_after is not None else None,
        "resource_tracker_gone_after_s": round(tracker_after, 2) if tracker_after is not None else None,
        "left_at_note": noted,
        "left": names,
    }


class Load:
    """Edges (in this process, like scenarios/replicas.py) sending split requests until stopped."""

    def __init__(self, cores: list, concurrency: int, deadline_ms: int = 20_000, seed: int = 0) -> None:
        self.cores, self.concurrency, self.deadline_ms = cores, concurrency, deadline_ms
        self.prompts = _problems(4000, seed)
        self.outcomes: list[Outcome] = []
        self._stop = False
        self._tasks: list[asyncio.Task] = []
        self._n = 0

    async def _worker(self) -> None:
        while not self._stop:
            i = self._n
            self._n += 1
            core = self.cores[i % len(self.cores)]
            self.outcomes.append(
                await _one(core, i % len(self.cores), i, self.prompts[i % len(self.prompts)], self.deadline_ms)
            )

    def start(self) -> Load:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        return self

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)

    def summary(self, since: float = 0.0) -> dict:
        """Requests the fault at ``since`` could touch: in flight then, or started after."""
        outs = [o for o in self.outcomes if o.end >= since]
        lost = [o for o in outs if not o.ok]
        edge_only = [o for o in outs if o.ok and o.source == "edge_only"]
        return {
            "requests": len(outs),
            "lost": len(lost),
            "lost_detail": [o.error for o in lost][:5],
            "hung": sum(o.error == "hung" for o in lost),
            "from_cloud": len(outs) - len(lost) - len(edge_only),
            "edge_only": len(edge_only),
            "edge_only_reasons": Counter(o.fallback[:70] for o in edge_only).most_common(4),
            "unflagged_edge_only": sum(not o.fallback for o in edge_only),
            "replayed": sum(bool(o.replays) for o in outs),
        }
