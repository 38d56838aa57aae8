"""Undecodable request bytes are the client's fault: INVALID_ARGUMENT, not UNKNOWN/INTERNAL.

grpc.aio parses a unary request before any handler runs and answers a parse failure with
UNKNOWN "Unexpected <class 'DecodeError'>"; a streamed message fails inside the handler's
loop. This interceptor gives every method (ours, health, reflection) a raw-bytes deserializer
and parses in the handler instead, so corrupt wire data and invalid UTF-8 in a string field
get INVALID_ARGUMENT naming the message type, with no Python class name. A streamed message that does
not parse raises ``UndecodableRequest`` in whichever task reads it; the call is ended by the handler's
task, which owns its writes (an abort from a reader task raced the handler's write: issue 51).

Large messages are parsed in a worker thread, and a handler may return its reply already
serialised (``bytes``, made in a worker thread): copying MiBs (a 16 MiB ``Probe`` answer) is tens of
milliseconds of the event loop otherwise.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError

from coinfer.errors import InvalidArgument, abort
from coinfer.serving.offload import run_sized


def _reason(exc: DecodeError) -> str:
    # upb: "Error parsing message with type 'coinfer.v1.X': Wire format was corrupt"
    return str(exc).rsplit(": ", 1)[-1] or "not a valid message"


OFF_LOOP_BYTES = 1 << 16
"""Messages larger than this are parsed off the event loop."""


class UndecodableRequest(InvalidArgument):
    """A request message that does not parse. Raised where it is read, never turned into the call's end
    there: a streamed request may be read by a task of its own (``coinfer.cloud.edge_reader``) while the
    handler writes, and an abort racing a write on the same call fails in gRPC's core
    (``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``, then ``Abort already called!``) with no status sent: the call
    hung until the client's deadline. The handler's task, which owns the call's writes, ends it: a coinfer
    servicer maps it like any ``InvalidArgument``, and the guard's wrapper ends a call whose handler let it
    through (health, reflection)."""


async def _parsed(parse: Callable[[bytes], object], raw: bytes, what: str):
    try:
        return await run_sized(len(raw), parse, raw, limit=OFF_LOOP_BYTES)
    except DecodeError as exc:
        raise UndecodableRequest(f"request: undecodable {what} ({_reason(exc)})", field="request") from None


def _name(parse: Callable[[bytes], object]) -> str:
    owner = getattr(parse, "__self__", None)  # Message.FromString is a classmethod
    return getattr(getattr(owner, "DESCRIPTOR", None), "full_name", "message")


def _unary(behavior, parse, what: str):
    if inspect.isasyncgenfunction(behavior):

        async def gen(raw: bytes, context):
            try:
                request = await _parsed(parse, raw, what)
            except UndecodableRequest as exc:
                await abort(context, exc)
            async for item in behavior(request, context):
                yield item

        return gen

    async def call(raw: bytes, context):
        try:
            request = await _parsed(parse, raw, what)
        except UndecodableRequest as exc:
            await abort(context, exc)
        return await behavior(request, context)

    return call


def _stream(behavior, parse, what: str):
    """A streaming request's handler: its messages parsed as they are read (an undecodable one raises
    ``UndecodableRequest`` in the reading task); a handler that does not end the call for it has it ended
    here, in the handler's task, between its writes."""

    async def requests(raw_iter: AsyncIterator[bytes]) -> AsyncIterator:
        async for raw in raw_iter:
            yield await _parsed(parse, raw, what)

    if inspect.isasyncgenfunction(behavior):

        async def gen(raw_iter, context):
            try:
                async for item in behavior(requests(raw_iter), context):
                    yield item
            except UndecodableRequest as exc:
                await abort(context, exc)

        return gen

    async def call(raw_iter, context):
        try:
            return await behavior(requests(raw_iter), context)
        except UndecodableRequest as exc:
            await abort(context, exc)

    return call


def _serializer(ser: Callable[[object], bytes] | None) -> Callable[[object], bytes] | None:
    if ser is None:
        return None

    def serialize(msg: object) -> bytes:
        return msg if isinstance(msg, bytes) else ser(msg)  # bytes: serialised by the handler, off the loop

    return serialize


class DecodeGuard(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse, what = handler.request_deserializer, _name(handler.request_deserializer)
        ser = _serializer(handler.response_serializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, parse, what), None, ser)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_unary(handler.unary_stream, parse, what), None, ser)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_stream(handler.stream_unary, parse, what), None, ser)
        return grpc.stream_stream_rpc_method_handler(_stream(handler.stream_stream, parse, what), None, ser)
