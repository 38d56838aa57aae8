"""The servers under test: a real cloud (vLLM) and a real edge daemon as subprocesses, each writing its stderr
to the campaign's log directory (``cloud.log``, ``edge.log``) and its stdout beside it (``*.out``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from coinfer.v1 import coinfer_pb2 as pb
from scenarios.hostile.targets import Endpoints

# ---- servers (subprocesses: a crash is an exit code, and each has its own event loop) ------------------


def _port(proc: subprocess.Popen, out: Path, prefix: str, timeout_s: float) -> int:
    """The port a server prints as ``<prefix> <port>`` on its stdout (``out``, a file: a pipe nobody reads
    after the port line fills up with vLLM's log lines, and the server blocks writing the next one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in out.read_text(errors="replace").splitlines():
            if line.startswith(prefix + " "):
                return int(line.split()[1])
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}) before printing {prefix!r}")
        time.sleep(0.1)
    raise RuntimeError(f"no {prefix!r} line within {timeout_s:.0f} s")


async def _serving(ep: Endpoints, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(ep.cloud) as ch:
        status = ch.unary_unary(
            "/coinfer.v1.CoinferCloud/Status",
            request_serializer=pb.StatusRequest.SerializeToString,
            response_deserializer=pb.StatusResponse.FromString,
        )
        while time.monotonic() < deadline:
            try:
                if (await status(pb.StatusRequest(), timeout=5)).ready:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError("the cloud did not become ready")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


@dataclass
class Servers:
    cloud: subprocess.Popen
    edge: subprocess.Popen
    endpoints: Endpoints

    @classmethod
    async def start(cls, logs: Path) -> Servers:
        from coinfer.demo.artifacts import ensure_artifacts

        art = ensure_artifacts()
        target, draft = art.target, art.draft_int8  # resolved (built if stale) before any server starts
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        procs: list[subprocess.Popen] = []

        def spawn(args: list[str], name: str) -> subprocess.Popen:
            # stdout (ports, and vLLM's log lines) and stderr (our logs) to files the servers never wait on
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", *args],
                    stdout=open(logs / f"{name}.out", "w"),
                    text=True,
                    env=env,
                    stderr=open(logs / f"{name}.log", "w"),
                )
            )
            return procs[-1]

        try:
            cloud = spawn(["coinfer.cloud.server", "--engine.model", str(target), "--port", "0"], "cloud")
            cport = await asyncio.to_thread(_port, cloud, logs / "cloud.out", "PORT", 120)
            await _serving(Endpoints(f"127.0.0.1:{cport}", "", ""))
            edge = spawn(
                [
                    "coinfer.edge.daemon",
                    "--model",
                    str(draft),
                    "--cloud",
                    f"127.0.0.1:{cport}",
                    "--grpc-port",
                    "0",
                    "--http-port",
                    "0",
                ],
                "edge",
            )
            gport = await asyncio.to_thread(_port, edge, logs / "edge.out", "GRPC", 300)
            hport = await asyncio.to_thread(_port, edge, logs / "edge.out", "HTTP", 30)
        except BaseException:
            _stop(procs)
            raise
        return cls(cloud, edge, Endpoints(f"127.0.0.1:{cport}", f"127.0.0.1:{gport}", f"http://127.0.0.1:{hport}"))

    def exit_codes(self) -> dict[str, int | None]:
        return {"cloud": self.cloud.poll(), "edge": self.edge.poll()}

    def stop(self) -> None:
        _stop([self.cloud, self.edge])
