"""Cloud failures as the edge sees them: whose fault (the request's, or the cloud's), which kind (data for
the breaker and the metrics), whether a replay on another replica can survive it, and ``CloudFailed``,
which carries what a failed run had to the lifecycle (``edge/lifecycle.py``) that answers locally."""

from __future__ import annotations

import asyncio

import grpc

from coinfer import types as t
from coinfer.edge.kinds import FallbackKind
from coinfer.edge.result import ResultBuilder
from coinfer.errors import Reason, error_info


def request_fault(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a cloud error is the request's own fault (the user gets it) rather than the cloud's
    (the user gets a local answer flagged with the reason). A full cloud (``SESSIONS_FULL``) and a
    refused token are the cloud's or the operator's problem, not a bad request; an input over a
    per-request limit (a named field) is the request's."""
    code = exc.code()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return True
    return code == grpc.StatusCode.RESOURCE_EXHAUSTED and error_info(exc)[0] != Reason.SESSIONS_FULL


def failure_kind(exc: BaseException) -> FallbackKind:
    """A cloud failure as data: the server's ``ErrorInfo`` reason (``coinfer.errors.Reason``); a deadline,
    the cloud's or the edge's own, is ``DEADLINE``; a stream that ended early is ``UNAVAILABLE``; any
    other call with no coinfer reason is ``TRANSPORT`` (its status name: ``failure_status``)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        reason = error_info(exc)[0]
        if reason:
            return FallbackKind.of_reason(reason)
        return FallbackKind.DEADLINE if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else FallbackKind.TRANSPORT
    return FallbackKind.DEADLINE if isinstance(exc, TimeoutError) else FallbackKind.UNAVAILABLE


def failure_status(exc: BaseException) -> str:
    """The gRPC status a cloud failure ended with, by name ("" when no call ended: the stream stopped
    early, or the edge's own wait ran out)."""
    return exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else ""


def cloud_failed(kind: FallbackKind | str) -> bool:
    """Whether a fallback (its ``failure_kind``) counts against the cloud in the circuit breaker
    (``FallbackKind.counts_against_cloud``)."""
    return FallbackKind(kind).counts_against_cloud


REPLAYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
)
"""Cloud failures a session survives by replaying on another replica: killed or draining (UNAVAILABLE),
cancelled by a stopping server, full (RESOURCE_EXHAUSTED "sessions:"; a request over a limit is the
request's fault, never replayed), a transport broken mid-stream (INTERNAL "Internal error from Core",
seen when a replica died under load) or a replica's own fault (INTERNAL / UNKNOWN: another replica
may not share it; the replay budget bounds a fault they all share)."""


def failure_reason(exc: BaseException) -> str:
    """A cloud failure as the user's fallback reason: a status code and what happened, never a class name."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, TimeoutError):
        return "DEADLINE_EXCEEDED: the cloud did not answer within the request's deadline"
    return f"UNAVAILABLE: {exc}" if str(exc) else "UNAVAILABLE: the cloud session ended early"


def replayable(exc: BaseException) -> bool:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in REPLAYABLE and not request_fault(exc)
    return isinstance(exc, ConnectionError)  # the stream ended without a summary


class CloudFailed(ConnectionError):
    """The cloud failed a run of the split or cloud plan (not the request's own fault: that is raised as
    the error it is), with what the run had when it did: every fallback is decided by the lifecycle
    (``edge/lifecycle.py``), which answers locally from it. Whoever catches it owns ``standby``:
    ``release`` cancels drafts it did not use."""

    def __init__(
        self,
        exc: BaseException,
        *,
        partial: ResultBuilder | None = None,
        written: list[t.Draft] | None = None,
        standby: asyncio.Task | None = None,
        t0: float = 0.0,
    ) -> None:
        super().__init__(failure_reason(exc))
        self.reason = failure_reason(exc)
        """The failure for people (``failure_reason``): the local answer's ``fallback_reason``."""
        self.kind = failure_kind(exc)
        """The failure as data (``failure_kind``)."""
        self.status = failure_status(exc)
        """The gRPC status it ended with (``failure_status``)."""
        self.partial = partial if partial is not None else ResultBuilder()
        """The run's result so far: its drafts (the last session's), verdicts, rounds, replays, timings."""
        self.written = list(written or [])
        """Drafts that existed before the last session (an escalation's, or those written before a
        replay), each index once."""
        self.standby = standby
        """The cloud plan's local drafts under way (the standby had started), else None."""
        self.t0 = t0
        """The run's clock (``time.perf_counter()`` at its start): its deadline counts from it."""

    async def release(self) -> None:
        """Cancel the standby's drafts if they are still being written (unused: no engine time for them)."""
        if self.standby is not None and not self.standby.done():
            self.standby.cancel()
            await asyncio.gather(self.standby, return_exceptions=True)
