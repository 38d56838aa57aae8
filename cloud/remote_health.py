"""Whether the vLLM server behind ``coinfer.cloud.remote_engine`` answers, kept up to date (``ServerWatch``).

The server is probed every ``EngineConfig.probe_period_s``: its ``/health`` (vLLM's: 503 once its engine core
died), then its ``/metrics`` (its scheduler's load: ``ServerLoad``). A probe refused or failed turns the watch
down at once; one not answered within ``probe_timeout_s`` too, unless a request of this replica's got output
from the server while the probe waited (busy, not hung: a loaded API server answers its probe late; output
from before the probe proves nothing of now: a server frozen just after it was taken for busy once, 5.7 s). A server that answers
again is checked to be the same model (``identify``: it may have come back serving another) before the watch
turns up. Each turn wakes ``changed``'s waiter: the cloud server's heartbeat, which sets the replica's health.
A request that lost its connection asks for a probe at once (``poke``) rather than turning the watch down
itself: one connection reset by a keep-alive race is not a server gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import httpx

from coinfer.cloud.config import EngineConfig
from coinfer.cloud.remote_http import ServerLoad, WrongServer, get, server_load
from coinfer.errors import Unavailable

log = logging.getLogger(__name__)


class ServerWatch:
    """The server's state as the last probe found it: ``up`` (and ``why`` not), ``load``."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        cfg: EngineConfig,
        identify: Callable[[], Awaitable[None]],
        last_output: Callable[[], float],
    ) -> None:
        self.http, self.cfg, self.identify, self.last_output = http, cfg, identify, last_output
        self.up = False
        self.why = "engine: the vLLM server has not been reached yet"
        self.load = ServerLoad()
        self._changed = asyncio.Event()
        self._poke = asyncio.Event()
        self._health_path = "/health"
        self._metrics = True
        self._task: asyncio.Task | None = None

    def start(self, up: bool) -> None:
        """Probe from now on; ``up``: the server was just checked (``RemoteEngine.start``)."""
        self.up = up
        self._task = asyncio.create_task(self._run(), name="vllm-server-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def poke(self) -> None:
        """Probe now (a request lost its connection, or failed on the server)."""
        self._poke.set()

    def fail(self, why: str) -> None:
        """Down now, whatever ``/health`` says (the server refused this replica's key: ``/health`` asks for none);
        up again once a probe finds the server checked as at start (``identify``, which sends the key)."""
        self._turn(False, why)

    async def changed(self) -> None:
        """Returns once ``up`` has turned since the last call returned."""
        await self._changed.wait()
        self._changed.clear()

    async def _run(self) -> None:
        while True:
            await self.probe()
            self._poke.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.probe_period_s):
                    await self._poke.wait()

    async def probe(self) -> None:
        """One probe, and the state it finds."""
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.cfg.probe_timeout_s):
                await self._health()
            if not self.up:  # back: the same model? (a completion: not under the probe's short timeout)
                async with asyncio.timeout(self.cfg.probe_timeout_s * 10):
                    await self.identify()
        except TimeoutError:
            if self.last_output() >= t0:
                return  # answered this replica's requests while the probe waited: busy, not hung
            self._turn(False, f"engine: the vLLM server did not answer within {self.cfg.probe_timeout_s:g} s")
        except (Unavailable, WrongServer) as exc:
            self._turn(False, str(exc))
        else:
            self._turn(True, "")

    async def _health(self) -> None:
        r = await get(self.http, self._health_path, self.cfg.probe_timeout_s)
        if r.status_code == 404 and self._health_path == "/health":  # a router without one: its model list
            self._health_path = "/v1/models"
            r = await get(self.http, self._health_path, self.cfg.probe_timeout_s)
        if r.status_code != 200:
            raise Unavailable(f"engine: the vLLM server's {self._health_path} answered {r.status_code}")
        if self._metrics:
            m = await get(self.http, "/metrics", self.cfg.probe_timeout_s)
            if m.status_code == 200:
                self.load = server_load(m.text)
            else:  # a router's or a gateway's: the load is then this replica's own requests
                self._metrics = False
                log.info(
                    "engine: the vLLM server has no /metrics (%d): load from this replica's requests", m.status_code
                )

    def _turn(self, up: bool, why: str) -> None:
        if up == self.up:
            self.why = why or self.why  # still down: the latest reason, said once when it went down
            return
        if up:
            log.info("engine: the vLLM server at %s answers again", self.cfg.url)
        else:
            log.error("%s", why)
        self.up, self.why = up, why
        self._changed.set()
