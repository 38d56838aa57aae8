"""The edge's side of a Session call, read by one task for the whole call.

A session ends as soon as it has answered (a draft that stands as is, the cloud's own answer), often while
the edge is still writing the drafts after it. Two things follow, both from grpc.aio:

- The session's parts stop reading when it ends, by cancellation. A grpc.aio read cancelled half-way may
  leave its receive operation pending in gRPC's core (as a cancelled write does, ``edge.remote``), and the
  drain below must read on; so one task (``EdgeReader``) reads the stream into a short queue, and the
  session reads (and abandons) the queue, never the stream.
- A call the server ends while the client still writes reaches a grpc.aio client as INTERNAL "Internal
  error from Core", not as the server's OK (grpc/grpc#36066, open as of grpcio 1.81): an answered session
  looked failed to the edge, which replayed it on another replica (5 of 48 sessions at 16 in flight, once
  drafts were accepted within a few ms). So after the Summary the reader drops what still comes until
  the edge half-closes (``half_closed``), for at most ``Limits.half_close_grace_s``; coinfer's edge
  half-closes as soon as it reads the Summary.

The reader never ends the call: what the stream raises (an undecodable message, ``UndecodableRequest``)
goes into the queue like a message, and the session's read raises it in the handler's task, which owns
the call's writes and its end (an abort from this task raced the handler's write of SessionAccepted:
``GRPC_CALL_ERROR_TOO_MANY_OPERATIONS``, no status sent, the call hung until the client's deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from coinfer.v1 import coinfer_pb2 as pb

QUEUE_DEPTH = 8
"""Messages read ahead of the session: past it the reader waits, and gRPC's flow control holds the edge."""
_END = object()


class EdgeReader:
    """The rest of a Session's request stream (after its SessionOpen), read by one task."""

    def __init__(self, requests: AsyncIterator[pb.EdgeMessage]) -> None:
        self._queue: asyncio.Queue = asyncio.Queue(maxsize=QUEUE_DEPTH)
        self._dropping = False
        self._task = asyncio.create_task(self._read(requests), name="edge-reader")

    async def _read(self, requests: AsyncIterator[pb.EdgeMessage]) -> None:
        try:
            async for msg in requests:
                if not self._dropping:
                    await self._queue.put(msg)
            await self._queue.put(_END)
        except Exception as exc:  # noqa: BLE001 - the session's read raises it
            await self._queue.put(exc)

    def __aiter__(self) -> AsyncIterator[pb.EdgeMessage]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[pb.EdgeMessage]:
        while (item := await self._queue.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item

    async def half_closed(self, grace_s: float) -> bool:
        """Drop what the edge still sends until it half-closes (True), or ``grace_s`` passes (False)."""
        self._dropping = True
        while not self._queue.empty():  # a reader waiting on a full queue goes on reading
            self._queue.get_nowait()
        done, _ = await asyncio.wait({self._task}, timeout=grace_s)
        return bool(done)

    async def close(self) -> None:
        """Stop reading (the call is ending)."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
