"""The remote engine's health watch (``coinfer.cloud.remote_health.ServerWatch``) on a scripted server (httpx's
MockTransport): a server gone turns it down at once, one back turns it up only once it is checked to serve the
target, a late probe is busy where requests get output and hung where none do; each turn wakes its waiter. A
real vLLM server killed and restarted is in tests/cloud/test_remote_engine.py."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from coinfer.cloud import remote_http
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.remote_health import ServerWatch
from coinfer.cloud.remote_http import WrongServer
from tests.virtual_time import run


class Scripted:
    """A vLLM server's probes: ``mode`` "up", "down" (connection refused), "hung" (never answers), "503"."""

    def __init__(self) -> None:
        self.mode = "up"
        self.identified = 0
        self.wrong = False
        self.busy = False
        self.last_output = 0.0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "down":
            raise httpx.ConnectError("All connection attempts failed")
        if self.mode == "hung":
            if self.busy:  # the server's answers to this replica's requests go on while the probe waits
                self.last_output = time.monotonic()
            await asyncio.Event().wait()
        if self.mode == "503":
            return httpx.Response(503)
        if request.url.path == "/metrics":
            return httpx.Response(200, text="vllm:num_requests_waiting 4.0\n")
        return httpx.Response(200)

    async def identify(self) -> None:
        self.identified += 1
        if self.wrong:
            raise WrongServer("engine.url: serves another model")

    def watch(self) -> ServerWatch:
        cfg = EngineConfig(model="m", url="http://vllm:8000", probe_timeout_s=0.5)
        http = remote_http.client(cfg, httpx.MockTransport(self.handle))
        return ServerWatch(http, cfg, self.identify, lambda: self.last_output)


def test_gone_then_back_then_another_model():
    server = Scripted()

    async def main() -> list:
        w, turns = server.watch(), []
        w.up = True
        await w.probe()
        assert w.up and w.load.waiting == 4 and server.identified == 0  # up and staying up: no identity check
        server.mode = "down"
        await w.probe()
        turns.append((w.up, "unreachable" in w.why))
        await asyncio.wait_for(w.changed(), 1)  # the heartbeat's waiter woken
        server.mode = "503"  # the API server back, its engine not yet
        await w.probe()
        turns.append((w.up, "503" in w.why))
        server.mode, server.wrong = "up", True  # back serving another model: never used
        await w.probe()
        turns.append((w.up, "another model" in w.why))
        server.wrong = False
        await w.probe()
        turns.append((w.up, server.identified))
        await asyncio.wait_for(w.changed(), 1)
        return turns

    assert run(main()) == [(False, True), (False, True), (False, True), (True, 2)]


@pytest.mark.parametrize("busy", [True, False])
def test_a_late_probe_is_busy_where_requests_get_output_and_hung_where_none_do(busy):
    server = Scripted()

    async def main() -> bool:
        w = server.watch()
        w.up = True
        server.last_output = time.monotonic()  # output just before the probe: proves nothing of now
        server.mode, server.busy = "hung", busy
        await w.probe()  # virtual time: the 0.5 s timeout fires at once, whatever the machine's load
        return w.up

    assert run(main()) is busy
