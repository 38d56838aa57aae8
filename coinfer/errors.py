"""The two error kinds both sides raise, mapped once to gRPC status codes.

Per-request errors (bad input, over a limit, cloud unreachable) are
recoverable: the server answers that request with a status and keeps serving.
Anything else is a bug or a dead engine and maps to INTERNAL / UNAVAILABLE.
"""

from __future__ import annotations

import logging
import uuid

import grpc

log = logging.getLogger(__name__)


class CoinferError(Exception):
    """Base class: a per-request error with a gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(CoinferError):
    """Malformed or out-of-range input; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(CoinferError):
    """Input over a configured limit (prompt or draft length, draft count, sessions)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(CoinferError):
    """The engine is loading, dead or draining; the client should fall back."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(CoinferError):
    """The request's own deadline passed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


def field_of(message: str) -> str:
    """What a message leads with, before its first colon: the field an error names
    ("temperature: must be ...") or a failure's code ("UNAVAILABLE: ...")."""
    return message.split(":")[0]


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> None:
    """End an RPC for ``exc``: its own status and message for a CoinferError, else INTERNAL with
    ``internal_error``'s message (the traceback goes to the log, not the client)."""
    if isinstance(exc, grpc.aio.AbortError):  # already ended (an undecodable message): keep its status
        raise exc
    if isinstance(exc, CoinferError):
        await context.abort(exc.code, exc.message)
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
        raise InvalidArgument(f"{field}: {message}")
