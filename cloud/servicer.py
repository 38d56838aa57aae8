"""Thin gRPC servicer: coinfer.v1 <-> domain types, work done by ``CloudCore``.

Errors are mapped once, here: a ``CoinferError`` becomes its status code with the
message naming the field; anything else is logged and becomes INTERNAL, and the
server goes on serving other sessions.

Each handler's task owns its call's writes (what it yields) and its end (``abort``): the tasks it
starts hand their errors to it (``EdgeReader`` through its queue), never end the call themselves,
since an abort racing a write on one call fails in gRPC's core and leaves the call hanging.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import grpc

from coinfer import convert
from coinfer import types as t
from coinfer.cloud.auth import BearerAuthInterceptor, peer_host
from coinfer.cloud.core import CloudCore
from coinfer.cloud.edge_reader import EdgeReader
from coinfer.cloud.session import DraftsDone, EdgeItem
from coinfer.errors import DeadlineExceeded, InvalidArgument, abort
from coinfer.serving.offload import run_sized
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import coinfer_pb2_grpc as pb_grpc

MAX_PROBE_BYTES = 16 << 20
_NOISE = os.urandom(1 << 20)
"""A Probe answer repeats this random MiB: incompressible within any compressor's window we may
meet (gzip: 32 KiB), where ``os.urandom(16 MiB)`` held the GIL for ~60 ms (in a worker thread too:
that stalled the event loop)."""


def probe_answer(n: int, received: int) -> bytes:
    """A serialised ``ProbeResponse`` with ``n`` payload bytes, written by hand: the payload is copied
    once (a join of the noise), where building the message and serialising it copied 16 MiB three
    times, each copy a native call holding the GIL (the loop waited on them). Protobuf parses fields
    in any order: the payload field first, then the small ones protobuf serialises."""
    head, length = bytearray(b"\x0a"), n  # field 1 (payload), wire type 2: tag, varint length, bytes
    while length > 0x7F:
        head.append(length & 0x7F | 0x80)
        length >>= 7
    head.append(length)
    tail = pb.ProbeResponse(received_bytes=received, server_time_ns=time.time_ns()).SerializeToString()
    whole, rest = divmod(n, len(_NOISE))
    return b"".join([bytes(head), *([_NOISE] * whole), _NOISE[:rest], tail])


class CoinferCloudServicer(pb_grpc.CoinferCloudServicer):
    def __init__(self, core: CloudCore, auth: BearerAuthInterceptor | None = None) -> None:
        self.core = core
        self.auth = auth
        self.replica = ""
        """host:port of this replica, stamped on every Summary (set once the port is bound)."""

    def _caller(self, context: grpc.aio.ServicerContext) -> str:
        return self.auth.caller(context) if self.auth is not None else peer_host(context)

    def _out(self, ev: t.CloudEvent) -> pb.CloudMessage:
        if isinstance(ev, t.Summary):
            ev.replica = self.replica
        return convert.event_to_pb(ev)

    async def Session(
        self, request_iterator: AsyncIterator[pb.EdgeMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CloudMessage]:
        reader: EdgeReader | None = None
        try:
            try:  # a stream that never opens must not hold a connection and a handler forever
                async with asyncio.timeout(self.core.cfg.limits.open_timeout_s):
                    first = await anext(aiter(request_iterator), None)
            except TimeoutError:
                raise DeadlineExceeded(
                    f"open: no SessionOpen within {self.core.cfg.limits.open_timeout_s:g} s"
                ) from None
            if first is None or first.WhichOneof("kind") != "open":
                raise InvalidArgument("open: the first message of a session must be SessionOpen")
            # rule params: up to MiBs of Struct, off the loop; a small open converts faster than a thread hop
            req = await run_sized(first.open.ByteSize(), convert.open_from_pb, first.open)
            reader = EdgeReader(request_iterator)

            async def inbox() -> AsyncIterator[EdgeItem]:
                async for msg in reader:
                    kind = msg.WhichOneof("kind")
                    if kind == "draft":
                        yield convert.from_pb(msg.draft, t.Draft)
                    elif kind == "done":
                        yield DraftsDone(msg.done.count, msg.done.continues)
                    else:
                        raise InvalidArgument(f"{kind or 'kind'}: only draft or done may follow open")

            async for ev in self.core.session(req, inbox(), self._caller(context)):
                yield self._out(ev)
            await reader.half_closed(self.core.cfg.limits.half_close_grace_s)
        except Exception as exc:  # noqa: BLE001 - mapped to a status, never crashes the server
            await abort(context, exc)
        finally:
            if reader is not None:
                await reader.close()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CloudMessage]:
        try:
            opened = pb.SessionOpen(
                request_id=request.request_id,
                problem=request.problem,
                deadline_ms=request.deadline_ms,
                refine=request.sampling if request.HasField("sampling") else None,
            )
            req = await run_sized(opened.ByteSize(), convert.open_from_pb, opened)
            async for ev in self.core.generate(req, self._caller(context)):
                yield self._out(ev)
        except Exception as exc:  # noqa: BLE001
            await abort(context, exc)

    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusResponse:
        return convert.to_pb(self.core.status(), pb.StatusResponse)

    async def Probe(self, request: pb.ProbeRequest, context: grpc.aio.ServicerContext) -> pb.ProbeResponse | bytes:
        if request.response_bytes > MAX_PROBE_BYTES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"response_bytes: {request.response_bytes} > limit {MAX_PROBE_BYTES}"
            )
        n, received = request.response_bytes, len(request.payload)
        if n <= 65536:
            return probe_answer(n, received)
        return await asyncio.to_thread(probe_answer, n, received)  # MiBs: off the loop; DecodeGuard sends bytes
