"""The session's outgoing events, in order, and the cloud's one record of what of the answer the client
has been shown.

Every answer chunk and every withdrawal goes through ``AnswerStream``: ``chunk`` streams text (and says
whether it is final), ``withdraw`` takes it all back (``AnswerReset``), ``replace`` makes the shown text
the answer. Other events (verdicts, retry advice, the Summary) go through ``put``, which refuses chunks
and resets so that nothing streams answer text past the record. The reader (``Session.run``) takes the
events with ``next`` (or ``events``): they end at ``end``, or raise what ``fail`` was given.

Writes never wait: the queue is unbounded (a session's events are bounded by its token budget), so
the writers are plain methods and a writer is never suspended between the record and the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from coinfer import types as t

_END = object()
"""The marker after the last event."""


class AnswerStream:
    """A session's events for the edge, and ``shown``: the answer text streamed since the last reset."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._shown = ""
        self._final = 0

    @property
    def shown(self) -> str:
        """The answer text the client has been streamed since the last ``AnswerReset``."""
        return self._shown

    @property
    def final(self) -> str:
        """Of ``shown``, the text up to its last chunk streamed as final: every answer the session ends on
        begins with it (a client that cannot take text back has shown it)."""
        return self._shown[: self._final]

    def put(self, event: t.CloudEvent) -> None:
        """An event that is not answer text (a Verdict, RetryAdvice, the Summary)."""
        if isinstance(event, (t.AnswerChunk, t.AnswerReset)):
            raise TypeError("answer text goes through chunk / withdraw / replace: they keep the record")
        self._queue.put_nowait(event)

    def chunk(self, text: str, final: bool = False) -> None:
        """Stream ``text``; ``final``: every answer the session can still end on begins with what was
        streamed so far, this included (``coinfer.cloud.answering``'s docstring says where)."""
        self._shown += text
        if final:
            self._final = len(self._shown)
        self._queue.put_nowait(t.AnswerChunk(text, final))

    def withdraw(self, reason: str) -> None:
        """Withdraw what was streamed (``AnswerReset``): the answer will be streamed anew. Nothing
        shown, nothing to withdraw: no reset."""
        if self._shown:
            self._shown, self._final = "", 0
            self._queue.put_nowait(t.AnswerReset(reason))

    def replace(self, answer: str, reason: str) -> None:
        """Make ``answer`` the text shown: where it is not what was streamed, withdraw that and stream
        the answer (final: decided), so that a client showing chunks as they come ends on the answer
        the Summary carries."""
        if self._shown == answer:
            return
        self.withdraw(reason)
        self.chunk(answer, final=True)

    def end(self) -> None:
        """No event follows."""
        self._queue.put_nowait(_END)

    def fail(self, exc: BaseException) -> None:
        """The session failed: ``events`` raises ``exc`` after the events before it."""
        self._queue.put_nowait(exc)

    async def next(self) -> t.CloudEvent | None:
        """The next event in order; None after ``end``; raises what ``fail`` was given. A plain coroutine, not a
        generator: the session's ``run`` yields from it directly, one generator fewer on the answer's way out."""
        ev = await self._queue.get()
        if ev is _END:
            return None
        if isinstance(ev, BaseException):
            raise ev
        return ev

    async def events(self) -> AsyncIterator[t.CloudEvent]:
        """The events in order, until ``end``; raises what ``fail`` was given (``next`` as an iterator)."""
        while (ev := await self.next()) is not None:
            yield ev
