"""The edge's side of a Session call: one reader for the whole call, and the call's end after the Summary.

The reader's logic around an async iterator; then a real gRPC server (TCP, 127.0.0.1, port 0) over a scripted
engine, whose sessions end on the first draft (the rules decide, the draft stands as is) while the client
still writes: grpc.aio reported such a call as INTERNAL "Internal error from Core" in place of OK
(grpc/grpc#36066), and the edge replayed answered sessions."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from coinfer.cloud.config import CloudConfig, EngineConfig, Limits, PolicyConfig
from coinfer.cloud.edge_reader import QUEUE_DEPTH, EdgeReader
from coinfer.cloud.server import create_server
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc
from tests.cloud.engines import ScriptedEngine
from tests.cloud.test_hedge import ARITH, ARITH_RIGHT


async def _stream(items, gate: asyncio.Event | None = None, fail: Exception | None = None):
    for x in items:
        yield x
    if gate is not None:
        await gate.wait()
    if fail is not None:
        raise fail


async def test_messages_come_in_order_and_a_read_error_is_the_sessions():
    reader = EdgeReader(_stream([1, 2, 3], fail=ValueError("broken stream")))
    got = []
    with pytest.raises(ValueError, match="broken stream"):
        async for m in reader:
            got.append(m)
    assert got == [1, 2, 3]
    await reader.close()


async def test_after_the_summary_the_rest_is_dropped_until_the_edge_half_closes():
    gate = asyncio.Event()
    reader = EdgeReader(_stream(range(3 * QUEUE_DEPTH), gate))  # more than the queue holds: the reader waits
    first = await anext(aiter(reader))  # the session reads one, then ends
    assert first == 0
    waiting = asyncio.create_task(reader.half_closed(5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # the edge has not half-closed yet
    gate.set()
    assert await waiting is True
    await reader.close()


async def test_an_edge_that_never_half_closes_is_given_the_grace_only():
    reader = EdgeReader(_stream([1], asyncio.Event()))  # never ends
    assert await reader.half_closed(0.05) is False
    await reader.close()


def _open(i: int) -> pb.EdgeMessage:
    return pb.EdgeMessage(
        open=pb.SessionOpen(
            request_id=f"r{i}", problem=pb.Problem(task="arith", prompt=ARITH.prompt), expected_drafts=5
        )
    )


def _draft(k: int) -> pb.EdgeMessage:
    return pb.EdgeMessage(draft=pb.Draft(index=k, text=ARITH_RIGHT, num_tokens=10, mean_logprob=-0.1))


@pytest.fixture
async def scripted_cloud():
    cfg = CloudConfig(
        engine=EngineConfig(model="/unused"),
        port=0,
        limits=Limits(half_close_grace_s=0.3),
        policy=PolicyConfig(hedge_below_odds=0.0),
    )
    srv = await create_server(cfg)
    await srv.attach_engine(ScriptedEngine({}, ARITH_RIGHT))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        yield pb_grpc.CoinferCloudStub(ch)
    await srv.stop(grace=0.5)


async def test_drafts_written_after_the_summary_do_not_fail_the_answered_call(scripted_cloud):
    """The first draft answers the session; the client writes the rest of its round only once it has read
    the Summary, then half-closes. Before the fix every such call ended INTERNAL on the client."""

    async def one(i: int) -> tuple[bool, grpc.StatusCode]:
        call = scripted_cloud.Session()
        await call.write(_open(i))
        await call.write(_draft(0))
        summary = False
        async for m in call:
            if m.WhichOneof("kind") == "summary":
                summary = True
                for k in range(1, 5):  # the round's later drafts, already on their way
                    await call.write(_draft(k))
                await call.write(pb.EdgeMessage(done=pb.DraftsDone(count=5)))
                await call.done_writing()
        return summary, await call.code()

    results = await asyncio.gather(*(one(i) for i in range(8)))
    assert results == [(True, grpc.StatusCode.OK)] * 8


async def test_a_client_that_never_half_closes_gets_its_status_after_the_grace(scripted_cloud):
    call = scripted_cloud.Session()
    await call.write(_open(0))
    await call.write(_draft(0))
    kinds = [m.WhichOneof("kind") async for m in call]  # the client reads to the end without half-closing
    assert kinds[-1] == "summary" and await call.code() == grpc.StatusCode.OK
