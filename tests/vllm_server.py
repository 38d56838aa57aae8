"""vLLM's own OpenAI server as a process group the tests start, kill, freeze and start again on the same port: the
server behind the remote engine (``coinfer.cloud.remote_engine``) in tests/cloud/test_remote_engine.py. Its
arguments are ``benchmarks.replica.vllm_server``'s (eager, 64 sequences a step, seed 0), its prefix-cache hits
reported in each answer's usage (``--enable-prompt-tokens-details``: the cost counts read them), its requests and
their aborts logged."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from coinfer.cloud.config import EngineConfig
from coinfer.cloud.vllm_common import engine_dtype
from scenarios.replicas import free_ports
from tests.waiting import until

SERVED_NAME = "target"
"""The name the server serves the model under: not its directory's (the remote engine must not assume it is)."""
START_GUARD_S = 600.0
"""A hang guard on the server's start: 10x+ the 30-60 s it takes on 2 cores (the model's load and warm-up)."""


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on ``model`` at 127.0.0.1:``port`` (a free one); its log
    in ``log_dir``. ``start``, ``kill`` (SIGKILL, the whole group), ``freeze`` / ``thaw`` (SIGSTOP / SIGCONT)."""

    def __init__(self, model: Path, log_dir: Path, *extra: str) -> None:
        self.model, self.log_dir, self.extra = model, log_dir, extra
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.log_dir / f"vllm-{self.starts}.log").open("w")
        argv = [
            *("-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model)),
            *("--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", SERVED_NAME),
            *("--enforce-eager", "--max-num-seqs", "64", "--seed", "0", "--enable-prompt-tokens-details"),
            # the prefix cache's granularity as the in-process engine has it (EngineConfig.block_size)
            *("--block-size", str(EngineConfig().block_size)),
            *("--dtype", engine_dtype(EngineConfig().dtype)),  # and its dtype
            "--enable-log-requests",  # "Aborted request(s) ..." in its log: what a test of cancellation reads
            *self.extra,
        ]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
        self.proc = subprocess.Popen(
            [sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )

    async def ready(self, guard_s: float = START_GUARD_S) -> float:
        """Seconds until the server's ``/health`` answers 200 (its engine loaded)."""
        async with httpx.AsyncClient() as http:

            async def up() -> bool:
                if self.proc is None or self.proc.poll() is not None:
                    raise AssertionError(f"vLLM's server exited: see {self.log_dir}")
                with contextlib.suppress(httpx.HTTPError):
                    return (await http.get(f"{self.url}/health", timeout=2)).status_code == 200
                return False

            return await until(up, guard_s=guard_s, what="vLLM's OpenAI server answers /health", poll_s=0.1)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> float:
        """SIGKILL the server's process group (its engine core too); the ``time.monotonic()`` it was sent."""
        t = time.monotonic()
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        return t

    def freeze(self) -> float:
        t = time.monotonic()
        self._signal(signal.SIGSTOP)
        return t

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    @contextlib.contextmanager
    def engine_frozen(self) -> Iterator[None]:
        """The server's engine processes stopped (SIGSTOP), its API server answering: a request it takes is
        held unanswered until the block ends, whatever the machine's speed."""
        import psutil

        engine = psutil.Process(self.proc.pid).children(recursive=True)
        for p in engine:
            p.suspend()
        try:
            yield
        finally:
            for p in engine:
                p.resume()

    def log_text(self) -> str:
        """The current run's log so far."""
        return (self.log_dir / f"vllm-{self.starts}.log").read_text(errors="replace")

    def stop(self) -> None:
        self.thaw()
        self._signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
