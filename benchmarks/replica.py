"""One replica for a load run, and the edges in front of it: coinfer's cloud service or vLLM's own OpenAI
server as a process group pinned to ``CLOUD_CORE`` (``Server``, its CPU time read from ``/proc``), and the
edges' draft engine replaying recorded drafts (``ReplayDrafts``). Used by ``benchmarks.capacity`` and
``benchmarks.cross_pair``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from coinfer.cloud.config import EngineConfig
from coinfer.cloud.vllm_common import engine_dtype
from scenarios.replicas import free_ports

CLOUD_CORE = 0
"""The replica's core; the edges and the load generator take the others."""
MAX_SESSIONS = 2048
"""coinfer's session slots in a load run (its default, 64, refused sessions past the SLO's load on the real model;
512 refused some at arith's overloaded rates past 200/s, 2026-12-06, where the edge then replayed them)."""

# ---- the replica's processes and their CPU time ----------------------------------------------------


def tree_cpu(pid: int) -> dict[str, float]:
    """User + system CPU seconds of process ``pid`` and all its descendants, now, summed by process name
    (vLLM titles its processes: ``VLLM::EngineCore``; the API server keeps the interpreter's name)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out: dict[str, float] = {}
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            c = p.cpu_times()
            name = p.name()
            out[name] = out.get(name, 0.0) + c.user + c.system
    return out


def _pinned_env() -> dict:
    """The environment of a replica on ``CLOUD_CORE``: vLLM's OpenMP threads bound there, its KV cache 1 GiB
    (both servers alike), no inherited thread-count override."""
    return dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=str(CLOUD_CORE), VLLM_CPU_KVCACHE_SPACE="1")


class Server:
    """A replica's process group on ``CLOUD_CORE`` (coinfer's cloud service or vLLM's OpenAI server)."""

    def __init__(self, argv: list[str], log_dir: Path, name: str) -> None:
        self.log = log_dir / f"{name}.log"
        self.url = ""
        """Where an HTTP server among them answers (vLLM's OpenAI server: ``vllm_server``)."""
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(CLOUD_CORE), sys.executable, *argv],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_pinned_env(),
        )

    def cpu_s(self) -> float:
        return sum(self.cpu_by_process().values())

    def cpu_by_process(self) -> dict[str, float]:
        return tree_cpu(self.proc.pid)

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.log.stem} exited with {self.proc.returncode}: see {self.log}")

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class ServerGroup:
    """Several process groups measured as one replica: the remote engine's (coinfer's cloud service and the vLLM
    server it sends the target's work to, both on ``CLOUD_CORE``), with each process's CPU time under its server's
    name (``coinfer/python``, ``vllm/VLLM::EngineCore``)."""

    def __init__(self, **servers: Server) -> None:
        self.servers = servers

    def cpu_s(self) -> float:
        return sum(s.cpu_s() for s in self.servers.values())

    def cpu_by_process(self) -> dict[str, float]:
        return {f"{k}/{name}": c for k, s in self.servers.items() for name, c in s.cpu_by_process().items()}

    def check(self) -> None:
        for s in self.servers.values():
            s.check()


async def _wait(ready: Callable[[], object], server: Server, what: str, timeout_s: float = 300.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        server.check()
        with contextlib.suppress(Exception):
            if await ready():
                return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s (log: {server.log})")


# ---- the edges: recorded drafts replayed ------------------------------------------------------------


class ReplayDrafts:
    """The edge's draft engine for a load run: a request's drafts (prompt + sampling) are drafted by the real
    engine while ``recording`` and recorded with their times; under load a recorded draw of the same request is
    handed over at those times again (the worker thread sleeps: no CPU), as an edge box of the user's own would.
    Each recording pass over a request adds a draw (the draft model samples unseeded: a fresh one), up to
    ``draws``; under load a request's draws are replayed in turn, so that with ``draws`` passes one unlucky draw is
    a ``1 / draws`` share of that request's traffic rather than all of it (issue 53)."""

    def __init__(self, real, draws: int = 1) -> None:
        self.real = real
        self.draws = draws
        self.recorded: dict[tuple, list[list]] = {}
        self.misses = 0
        self.recording = True
        self.draft_cpu_s = 0.0
        """This process's CPU time spent in the real engine's drafting calls (their threads and ONNX Runtime's,
        and whatever else ran in the process meanwhile: an upper bound on the drafting's own)."""
        self.calls = 0
        self.fresh = 0
        """Drafting calls, and of them those the real engine drafted (a miss, or a recording pass's new draw)."""
        self._turn: dict[tuple, int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str):  # render, encode, runs, providers, lm, ...: the real engine's
        return getattr(self.real, name)

    def generate(self, prompt: str, s, on_draft=None, cancelled=None, greedy: int = 0, greedy_tokens: int = 0) -> list:
        key = (
            prompt,
            tuple(sorted(dataclasses.asdict(s).items(), key=lambda kv: kv[0])).__repr__(),
            greedy,
            greedy_tokens,
        )
        with self._lock:
            draws = self.recorded.get(key, [])
            fresh = not draws or (self.recording and len(draws) < self.draws)
            self.calls += 1
            self.fresh += fresh
            if not fresh:
                turn = self._turn.get(key, 0)
                self._turn[key] = turn + 1
                drafts = draws[turn % len(draws)]
        if fresh:
            cpu0 = time.process_time()
            drafts = self.real.generate(prompt, s, on_draft, cancelled, greedy, greedy_tokens)
            with self._lock:
                self.misses += not self.recording
                self.draft_cpu_s += time.process_time() - cpu0
                kept = self.recorded.setdefault(key, [])
                if len(kept) < self.draws:  # (two threads drafting one request at once keep no more than draws)
                    kept.append(drafts)
            return drafts
        t0 = time.perf_counter()
        out = []
        for d in sorted(drafts, key=lambda d: d.edge_ms):
            wait = d.edge_ms / 1e3 - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            if cancelled is not None and cancelled():
                break
            out.append(d)
            if on_draft is not None:
                on_draft(d)
        return out


# ---- the two stacks ------------------------------------------------------------------------------------


NGRAM_SPECULATION = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
"""vLLM's own n-gram (prompt-lookup) speculative decoding, as ``EngineConfig.ngram_speculative_tokens`` configures
it: the baseline that speculates with no draft model (``benchmarks.capacity``'s ``vllm-ngram``)."""


PROMPT_DETAILS = ("--enable-prompt-tokens-details",)
"""vLLM's server argument that puts the prefix cache's hits in each usage block: the work counted beside coinfer's
(``Summary.cost``), and what the remote engine's cost counts read."""


@contextlib.asynccontextmanager
async def vllm_server(
    model: Path,
    log_dir: Path,
    max_len: int,
    dtype: str = "auto",
    speculative: dict | None = None,
    extra: tuple[str, ...] = (),
):
    """vLLM's own OpenAI server on the target, pinned like coinfer's replica (``speculative``: its
    ``--speculative-config``; ``extra``: more of its arguments); yields (server, client, name), the server's
    ``url`` set."""
    import httpx
    from openai import AsyncOpenAI

    (port,) = free_ports(1)
    srv = Server(
        [
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--served-model-name",
            "target",
            "--enforce-eager",
            "--dtype",
            engine_dtype(dtype),  # as coinfer's in-process engine resolves "auto"
            "--max-num-seqs",
            "64",
            "--seed",
            "0",
            "--max-model-len",
            str(max_len),
            # the prefix cache's granularity as coinfer's engine has it (EngineConfig.block_size): the same cache
            "--block-size",
            str(EngineConfig().block_size),
            *(("--speculative-config", json.dumps(speculative)) if speculative else ()),
            *extra,
        ],
        log_dir,
        f"vllm-{model.name}" + ("-spec" if speculative else ""),
    )
    srv.url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:

            async def ok() -> bool:
                return (await http.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)).status_code == 200

            await _wait(ok, srv, "vLLM's OpenAI server")
        client = AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key="unused",
            max_retries=0,
            timeout=300,
            http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=512)),
        )
        yield srv, client, "target"
    finally:
        srv.stop()


@contextlib.asynccontextmanager
async def coinfer_stack(
    model: Path, draft: Path, log_dir: Path, max_len: int, dtype: str = "auto", engine_url: str = "", draws: int = 1
):
    """coinfer's cloud service on the target (pinned) and an edge core here over it; yields (server, core, drafts).
    ``engine_url``: the target on that vLLM server (``--engine.url``: the remote engine), not in the service;
    ``draws``: ``ReplayDrafts``'s."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.service import EdgeCore

    (port,) = free_ports(1)
    srv = Server(
        [
            *("-m", "coinfer.cloud.server", str(model), "--port", str(port), "--engine.max-model-len", str(max_len)),
            *("--engine.dtype", dtype),
            # every simulated user's edge shares this process's one connection, and vLLM's own server admits
            # every request: the SLO, not the session slots, says what the replica holds
            *("--limits.max-sessions", str(MAX_SESSIONS), "--limits.max-sessions-per-edge", "0"),
            *(("--engine.url", engine_url) if engine_url else ()),
        ],
        log_dir,
        f"coinfer-{model.name}" + ("-remote" if engine_url else ""),
    )
    core = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def serving() -> bool:
                r = await stub.Check(health_pb2.HealthCheckRequest(service="coinfer.v1.CoinferCloud"), timeout=2)
                return r.status == health_pb2.HealthCheckResponse.SERVING

            await _wait(serving, srv, "coinfer's cloud service")
        with tempfile.TemporaryDirectory() as state:
            core = EdgeCore(
                EdgeConfig(
                    model=str(draft),
                    cloud=f"127.0.0.1:{port}",
                    grpc_port=0,
                    http_port=0,
                    planner_state=str(Path(state) / "planner.json"),
                    max_drafts=16,
                )
            )
            await core.start()
            for _ in range(100):  # the channel's health watch sees the replica SERVING
                if core.link.serving:
                    break
                await asyncio.sleep(0.1)
            real = await core.ensure_engine()
            drafts = ReplayDrafts(real, draws)
            core.engine = drafts
            yield srv, core, drafts
    finally:
        if core is not None:
            await core.close()
        srv.stop()


@contextlib.asynccontextmanager
async def remote_stack(model: Path, draft: Path, log_dir: Path, max_len: int, dtype: str = "auto", draws: int = 1):
    """coinfer's cloud service over the remote engine: vLLM's own OpenAI server (``PROMPT_DETAILS``) and the cloud in
    front of it (``--engine.url``), measured together as one replica; yields (replica, core, drafts) as
    ``coinfer_stack`` does."""
    async with vllm_server(model, log_dir, max_len, dtype, extra=PROMPT_DETAILS) as (vllm, _, _):
        stack = coinfer_stack(model, draft, log_dir, max_len, dtype, engine_url=vllm.url, draws=draws)
        async with stack as (srv, core, drafts):
            yield ServerGroup(coinfer=srv, vllm=vllm), core, drafts
