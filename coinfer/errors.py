"""The two error kinds both sides raise, mapped once to gRPC status codes.

Per-request errors (bad input, over a limit, cloud unreachable) are
recoverable: the server answers that request with a status and keeps serving.
Anything else is a bug or a dead engine and maps to INTERNAL / UNAVAILABLE.
"""

from __future__ import annotations

import logging
import uuid
from enum import StrEnum

import grpc

log = logging.getLogger(__name__)

DOMAIN = "coinfer.v1"
"""The ``google.rpc.ErrorInfo`` domain of every reason below."""


class Reason(StrEnum):
    """Why a request failed, as data: sent as the ``google.rpc.ErrorInfo`` reason of its status (with
    the field it concerns in the metadata), so that a peer decides on it, never on message text."""

    BAD_FIELD = "BAD_FIELD"
    """A field is malformed or out of range: the request's own fault."""
    OVER_LIMIT = "OVER_LIMIT"
    """A field is over a per-request limit (prompt or draft length, draft count): the request's fault."""
    SESSIONS_FULL = "SESSIONS_FULL"
    """Every session slot of the replica (or this edge's quota) is in use: load; another replica may serve."""
    UNAVAILABLE = "UNAVAILABLE"
    """Loading, draining or dead: fall back or go elsewhere."""
    ENGINE_HUNG = "ENGINE_HUNG"
    """The engine produced nothing for the heartbeat's timeout."""
    DEADLINE = "DEADLINE"
    """The request's own deadline passed."""
    INTERNAL = "INTERNAL"


class CoinferError(Exception):
    """Base class: a per-request error with a gRPC status code, a reason and the field it concerns."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    default_reason: Reason = Reason.INTERNAL

    def __init__(self, message: str, *, reason: Reason | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        # the field as data: given by the raiser (``require``), or from a peer's ErrorInfo (``from_rpc``);
        # a message raised here without one leads with its field ("temperature: must be ..."), read once
        self.field = field if field is not None else field_of(message)


class InvalidArgument(CoinferError):
    """Malformed or out-of-range input; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = Reason.BAD_FIELD


class ResourceExhausted(CoinferError):
    """Input over a configured limit (prompt or draft length, draft count), or every session in use
    (``Reason.SESSIONS_FULL``)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = Reason.OVER_LIMIT


class Unavailable(CoinferError):
    """The engine is loading, dead or draining; the client should fall back."""

    code = grpc.StatusCode.UNAVAILABLE
    default_reason = Reason.UNAVAILABLE


class DeadlineExceeded(CoinferError):
    """The request's own deadline passed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_reason = Reason.DEADLINE


def status_of(exc: CoinferError) -> grpc.Status:
    """``exc`` as a gRPC status whose details carry a ``google.rpc.ErrorInfo`` (reason, field)."""
    from google.rpc import error_details_pb2, status_pb2
    from grpc_status import rpc_status

    info = error_details_pb2.ErrorInfo(
        reason=exc.reason.value, domain=DOMAIN, metadata={"field": exc.field} if exc.field else {}
    )
    status = status_pb2.Status(code=exc.code.value[0], message=exc.message)
    status.details.add().Pack(info)
    return rpc_status.to_status(status)


def error_info(exc: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    """(reason, metadata) of the ``google.rpc.ErrorInfo`` a coinfer server sent with a failed call;
    ("", {}) when there is none (a transport failure, another server)."""
    from google.rpc import error_details_pb2, status_pb2

    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info) and info.domain == DOMAIN:
                    return info.reason, dict(info.metadata)
    return "", {}


def from_rpc(exc: grpc.aio.AioRpcError) -> CoinferError:
    """A peer's refusal of a request (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) as the error this side raises:
    the kind by status code, the reason and the field from its ``ErrorInfo`` (never from the message
    text; a status without one names no field)."""
    reason, meta = error_info(exc)
    kind = {
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
        grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
        grpc.StatusCode.UNAVAILABLE: Unavailable,
        grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    }.get(exc.code(), CoinferError)
    known = reason in Reason.__members__
    return kind(
        exc.details() or "request: refused by the cloud",
        reason=Reason(reason) if known else None,
        field=meta.get("field", ""),
    )


def field_of(message: str) -> str:
    """What a message leads with, before its first colon: the field an error names
    ("temperature: must be ...") or a failure's code ("UNAVAILABLE: ...")."""
    return message.split(":")[0]


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """End an RPC for ``exc``: its own status and message for a CoinferError, else INTERNAL with
    ``internal_error``'s message (the traceback goes to the log, not the client)."""
    if isinstance(exc, grpc.aio.AbortError):  # already ended by an abort in this task: keep its status
        raise exc
    if isinstance(exc, CoinferError):
        status = status_of(exc)
        await context.abort(status.code, status.details, status.trailing_metadata)
    await context.abort(grpc.StatusCode.INTERNAL, internal_error(exc))


def internal_error(exc: BaseException) -> str:
    """Log a bug's traceback under a short id and return the client's message: the id, never the
    exception's class, text or paths (they describe the server, and may echo another client's data)."""
    ref = uuid.uuid4().hex[:8]
    log.error("internal error [%s]", ref, exc_info=exc)
    return f"internal error [{ref}]; the server's log has the details"


def require(cond: bool, field: str, message: str) -> None:
    """Raise InvalidArgument('<field>: <message>') unless ``cond``."""
    if not cond:
        raise InvalidArgument(f"{field}: {message}", field=field)
