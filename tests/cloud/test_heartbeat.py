"""The engine heartbeat's logic (docs/design.md §5.2) around a stand-in engine: a hung engine is told from
a busy one, and the server turns NOT_SERVING, restarts the engine and serves again. The same on the
real vLLM engine (its process SIGSTOPped) is in the fault campaign (tests/integration/test_faults.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coinfer.cloud.config import CloudConfig, EngineConfig
from coinfer.cloud.engine import Chunk, EngineStats, TargetEngine
from coinfer.cloud.server import create_server
from coinfer.errors import Unavailable
from tests.virtual_time import now, run
from tests.waiting import until


class StandIn(TargetEngine):
    """Answers one token at once, or (hung) never."""

    def __init__(self, hung: bool = False) -> None:
        self.hung, self.closed, self.close_wait_s = hung, False, None

    async def generate(self, prompt, params, request_id):
        if self.hung:
            await asyncio.Event().wait()
        yield Chunk("x", 1)

    async def check_health(self) -> None:
        if self.closed:
            raise Unavailable("engine: closed")

    def stats(self) -> EngineStats:
        return EngineStats(0, 4, not self.closed)

    async def close(self, wait_s: float | None = None) -> None:
        self.closed, self.close_wait_s = True, wait_s

    def count_tokens(self, text):
        return len(text)

    async def sample(self, *a):
        return []

    async def continuation_logprobs(self, *a, **kw):
        return []

    async def judge(self, *a):
        return "{}"

    async def abort(self, request_id):
        pass

    max_model_len = 64


@pytest.fixture
def engine_clock(monkeypatch):
    """The heartbeat's ``time.monotonic`` is the running loop's clock: these tests run on virtual time
    (tests/virtual_time.py), where a busy engine's outputs every 20 ms, the 0.2 s timeout and a stalled loop
    happen exactly as written (on the wall clock a busy machine made the timeout fire late or the outputs
    come late, and the heartbeat's verdict with it)."""
    from coinfer.cloud import engine

    monkeypatch.setattr(engine, "time", SimpleNamespace(monotonic=now, monotonic_ns=time.monotonic_ns))


def test_hung_is_told_from_busy(engine_clock):
    async def main() -> None:
        await StandIn().heartbeat(1.0)
        hung = StandIn(hung=True)
        with pytest.raises(Unavailable, match="hung"):
            await hung.heartbeat(0.2)

        async def others_get_output() -> None:  # busy, not hung: the heartbeat waits in line, others progress
            while True:
                hung.last_output = now()
                await asyncio.sleep(0.02)

        busy = asyncio.create_task(others_get_output())
        await hung.heartbeat(0.2)
        busy.cancel()

    run(main())


def test_a_loop_that_stood_still_is_not_an_engine_that_hung(engine_clock, monkeypatch):
    # the event loop blocked past the timeout (a sync test building a model for minutes, with this
    # server in the same process): the timeout fires late, and the engine's outputs went unread
    from coinfer.cloud import engine

    monkeypatch.setattr(engine, "LOOP_STALL_S", 0.1)

    async def main() -> None:
        hung = StandIn(hung=True)

        async def stand_still() -> None:
            await asyncio.sleep(0.05)
            asyncio.get_running_loop().stall(0.5)  # the loop blocked: nothing runs, the timeout cannot fire

        blocker = asyncio.create_task(stand_still())
        await hung.heartbeat(0.2)  # fired 0.35 s late: asks again next time
        await blocker
        with pytest.raises(Unavailable, match="hung"):  # on time, no output: hung
            await hung.heartbeat(0.2)

    run(main())


async def _status(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        return r.status


async def test_a_hung_engine_is_restarted_and_the_replica_serves_again():
    srv = await create_server(
        CloudConfig(engine=EngineConfig(model="/unused"), port=0, heartbeat_period_s=0.1, heartbeat_timeout_s=0.3)
    )
    fresh = StandIn()
    started = asyncio.Event()

    async def factory() -> TargetEngine:
        await started.wait()  # hold the restart so the NOT_SERVING window can be seen
        return fresh

    srv.engine_factory = factory
    first = StandIn()  # answers until the test has seen the replica SERVING, then hangs: under load the first
    # health check once came after the heartbeat had already found a hung-from-the-start engine (0.4 s)
    try:
        await srv.attach_engine(first)
        assert await _status(srv.port) == health_pb2.HealthCheckResponse.SERVING
        first.hung = True

        async def not_serving() -> bool:
            return await _status(srv.port) == health_pb2.HealthCheckResponse.NOT_SERVING

        # the heartbeat's period and timeout: 0.4 s (measured 0.40 s)
        await until(not_serving, guard_s=10, what="a hung engine's replica NOT_SERVING")
        assert first.closed and srv.core.engine is None  # new sessions: UNAVAILABLE "restarting"
        assert first.close_wait_s == 0  # its processes killed at once: a hung engine is not waited for
        started.set()
        await until(lambda: srv.core.engine is fresh, guard_s=10, what="the fresh engine attached")  # 0.05-0.1 s
        assert srv.core.engine is fresh and await _status(srv.port) == health_pb2.HealthCheckResponse.SERVING
        assert srv.core.metrics.restarts.labels("hung")._value.get() == 1
    finally:
        started.set()
        await srv.stop(grace=0.1)


class Recovering(StandIn):
    """An engine that comes back by itself (a remote server that restarts): ``down`` says why it fails, and
    each change of it wakes the heartbeat."""

    recovers = True

    def __init__(self) -> None:
        super().__init__()
        self.down = ""
        self._changed = asyncio.Event()

    def turn(self, down: str) -> None:
        self.down = down
        self._changed.set()

    async def health_changed(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    async def check_health(self) -> None:
        if self.down:
            raise Unavailable(self.down)

    def stats(self) -> EngineStats:
        return EngineStats(0, 4, not self.down)


async def test_an_engine_that_recovers_is_never_replaced_and_serves_again_when_it_answers():
    # a heartbeat period no test waits for: each turn is seen because the engine said it changed
    srv = await create_server(CloudConfig(engine=EngineConfig(model="/unused"), port=0, heartbeat_period_s=3600))
    replaced = []

    async def factory() -> TargetEngine:
        replaced.append(True)
        return StandIn()

    srv.engine_factory = factory
    engine = Recovering()
    try:
        await srv.attach_engine(engine)
        assert await _status(srv.port) == health_pb2.HealthCheckResponse.SERVING
        for down, status in (("engine: the vLLM server is unreachable", "NOT_SERVING"), ("", "SERVING")) * 2:
            engine.turn(down)
            want = getattr(health_pb2.HealthCheckResponse, status)

            async def turned(want=want) -> bool:
                return await _status(srv.port) == want

            await until(turned, guard_s=10, what=f"the replica {status} after its engine turned")  # measured: ms
        assert srv.core.engine is engine and not replaced and not engine.closed
    finally:
        await srv.stop(grace=0.1)
