"""Undecodable request bytes get INVALID_ARGUMENT on every method of a real server,
and the guard leaves health (unary and streaming) and reflection working."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from coinfer.cloud.config import CloudConfig, EngineConfig
from coinfer.cloud.server import create_server
from coinfer.v1 import coinfer_pb2 as pb

GARBAGE = [b"\xff\xff\xff", b"\x0a", b"\x0a\x02\xff\xfe"]  # corrupt, truncated, invalid UTF-8 in a string


@pytest.fixture
async def server():
    srv = await create_server(CloudConfig(engine=EngineConfig(model="/unused"), port=0))
    yield srv
    await srv.stop(grace=0.1, close_engine=False)


async def _call(ch, kind: str, method: str, payload: bytes):
    path = f"/coinfer.v1.CoinferCloud/{method}"
    if kind == "unary":
        return await ch.unary_unary(path)(payload, timeout=5)
    if kind == "stream":
        return [m async for m in ch.unary_stream(path)(payload, timeout=5)]
    return [m async for m in ch.stream_stream(path)(iter([payload]), timeout=5)]


@pytest.mark.parametrize(
    "kind, method", [("unary", "Status"), ("unary", "Probe"), ("stream", "Generate"), ("bidi", "Session")]
)
async def test_undecodable_bytes_are_invalid_argument(server, kind, method):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        for payload in GARBAGE:
            if method in ("Status", "Probe") and payload == GARBAGE[2]:
                continue  # field 1 of these is bytes / absent: valid for them
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(ch, kind, method, payload)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, payload, err.value.details())
            assert err.value.details().startswith("request: undecodable coinfer.v1.")
            assert "<class" not in err.value.details() and "Error:" not in err.value.details()
        # a valid message still works on the same channel
        status = pb.StatusResponse.FromString(await ch.unary_unary("/coinfer.v1.CoinferCloud/Status")(b"", timeout=5))
        assert status.model == "unused" and not status.ready


async def test_health_and_reflection_pass_the_guard(server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        hs = health_pb2_grpc.HealthStub(ch)
        assert (await hs.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch = hs.Watch(health_pb2.HealthCheckRequest(service="coinfer.v1.CoinferCloud"))
        assert (await anext(aiter(watch))).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        refl = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name async for r in refl for s in r.list_services_response.service}
        assert "coinfer.v1.CoinferCloud" in names
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/grpc.health.v1.Health/Check")(b"\xff", timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


HANG_GUARD_S = 30
"""Each call's deadline, a hang guard only: with the fix each of these calls ended in 2-35 ms (this 2-core
machine, scripted engine); the hang it guards against lasted to the deadline (the client's 15 s)."""


async def corrupt_after_open(ch: grpc.aio.Channel, runs: int = 20) -> None:
    """``runs`` Session calls, one after another, each a valid SessionOpen then ``b"\\xff\\xff\\xff"`` as the next
    EdgeMessage, the stream kept open (as the grpc-js client of issue 51 did). The garbage is read by the
    session's reader task while the handler writes SessionAccepted: its abort raced that write
    (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, then "Abort already called!") and 9 calls in 10 hung until their
    deadline. Each must end with INVALID_ARGUMENT naming the message."""
    from coinfer import convert
    from coinfer import types as t

    req = t.OpenRequest(
        request_id="", task="arith", prompt="If x=3 and y=5, compute (x+y)^2-x*y.", rules=[], refine=None
    )
    opening = pb.EdgeMessage(open=convert.open_to_pb(req)).SerializeToString()
    session = ch.stream_stream(
        "/coinfer.v1.CoinferCloud/Session",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.CloudMessage.FromString,
    )

    async def requests():
        yield opening
        yield b"\xff\xff\xff"
        await asyncio.Event().wait()  # never half-closed: the call ends when the server ends it

    for run in range(runs):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in session(requests(), timeout=HANG_GUARD_S):
                pass
        details = err.value.details()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (run, details)
        assert details.startswith("request: undecodable coinfer.v1.EdgeMessage"), details


async def test_a_corrupt_message_after_a_valid_open_ends_the_session_at_once():
    from tests.cloud.engines import ScriptedEngine

    engine = ScriptedEngine({}, reply="3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49")
    srv = await create_server(CloudConfig(engine=EngineConfig(model="/unused"), port=0), engine=engine)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            await corrupt_after_open(ch)
            # the server still serves on the same channel, and no session is left counted
            status = pb.StatusResponse.FromString(
                await ch.unary_unary("/coinfer.v1.CoinferCloud/Status")(b"", timeout=5)
            )
            assert status.ready and status.active_sessions == 0
    finally:
        await srv.stop(grace=0.1, close_engine=False)
