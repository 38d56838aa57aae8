"""A client cannot hold a server: a stream that never opens is closed, and one edge gets at most its
per-edge share of the session slots. A second real server on the shared engine."""

import asyncio

import grpc
import pytest

from coinfer.v1 import coinfer_pb2_grpc as pb_grpc
from tests.cloud.test_service import WRONG, draft, open_msg
from tests.waiting import until


@pytest.fixture
async def small(cloud):
    from coinfer.cloud.config import CloudConfig, Limits
    from coinfer.cloud.server import create_server

    srv = await create_server(
        CloudConfig(engine=cloud.cfg.engine, limits=Limits(max_sessions=8, max_sessions_per_edge=2, open_timeout_s=0.5))
    )
    await srv.attach_engine(cloud.core.engine)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        yield srv, pb_grpc.CoinferCloudStub(ch)
    await srv.stop(grace=0.5, close_engine=False)  # the engine is the shared fixture's


async def _holding(gate: asyncio.Event):
    """A session's messages: open, one draft the rules refuse (one they pass would answer the session at
    once), then nothing until ``gate`` is set."""
    yield open_msg()
    yield draft(0, WRONG)
    await gate.wait()


async def _open_only(gate: asyncio.Event):
    """A session's open alone, then nothing until ``gate`` is set: for a session the cloud refuses at open (a
    write after the open would race the refusal, and grpc.aio reports that as INTERNAL: grpc/grpc#36066)."""
    yield open_msg()
    await gate.wait()


async def _hold(stub, n: int, gate: asyncio.Event) -> list:
    """``n`` accepted sessions that stay open until ``gate`` is set."""
    held = [stub.Session(_holding(gate), timeout=120) for _ in range(n)]
    for call in held:
        assert (await call.read()).WhichOneof("kind") == "accepted"
    return held


async def test_a_stream_that_never_opens_is_closed(small):
    srv, stub = small
    call = stub.Session(timeout=30)  # opens the stream, sends nothing
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "open: no SessionOpen" in err.value.details()
    assert srv.core.active == 0


async def test_one_edge_gets_its_share_of_the_slots_not_all(small):
    srv, stub = small
    gate = asyncio.Event()
    held = await _hold(stub, 2, gate)
    third = stub.Session(_open_only(gate), timeout=60)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await third.read()
    # "sessions:" marks capacity, not a bad request: the edge answers locally or replays elsewhere
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details().startswith("sessions: 2 active for this edge, limit 2 per edge")
    for call in held:
        call.cancel()
    gate.set()
    await until(lambda: srv.core.active == 0, guard_s=10, what="the cancelled sessions' slots freed")  # measured 0.02 s
    assert not srv.core.per_edge


async def test_a_full_cloud_does_not_open_the_edges_breaker(small, int8_draft):
    """A refusal for capacity is load, not a failure: the edge answers from its drafts, flagged, and keeps its
    circuit closed (three in a row used to open it against a healthy cloud for 10 s)."""
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.service import Done, EdgeCore, SolveRequest

    srv, stub = small
    gate = asyncio.Event()
    held = await _hold(stub, 2, gate)  # this host's whole quota
    core = EdgeCore(
        EdgeConfig(
            model=str(int8_draft),
            cloud=f"127.0.0.1:{srv.port}",
            probe_on_start=False,
            grpc_port=-1,
            http_port=-1,
            plan="split",
            replays=0,
        )
    )
    await core.start()
    try:
        for i in range(4):
            done = [
                ev
                async for ev in core.solve(
                    SolveRequest(prompt="If x=1 and y=2, compute x+y.", plan="split", request_id=f"full{i}")
                )
                if isinstance(ev, Done)
            ]
            r = done[0].result
            assert r.source == "edge_only" and r.fallback_reason.startswith("RESOURCE_EXHAUSTED: sessions:")
        assert core.link.breaker.state == "closed"
    finally:
        for call in held:
            call.cancel()
        gate.set()
        await core.close()
