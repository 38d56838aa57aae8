"""Bearer-token authentication per edge box, as a gRPC server interceptor.

Each edge has its own token (``{"edge-a": "token...", ...}``), so one box can be
revoked without touching the others, and logs name the edge. A call without
``authorization: Bearer <token>`` metadata, or with an unknown token, ends with
UNAUTHENTICATED before it reaches the servicer. Health checks and reflection
stay open: Kubernetes' native gRPC probes carry no credentials.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from pathlib import Path

import grpc

log = logging.getLogger(__name__)
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def load_tokens(path: Path) -> dict[str, str]:
    """A JSON object ``{edge_id: token}``; errors name the file and the entry."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable token file: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON object {{edge_id: token}}")
    for edge, token in data.items():
        if not isinstance(token, str) or len(token) < 16:
            raise ValueError(f"{path}: token of {edge!r} must be a string of at least 16 characters")
    return data


def _deny(message: str) -> Callable:
    async def deny(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return deny


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = [(edge, tok.encode()) for edge, tok in tokens.items()]

    def edge_of(self, token: str) -> str | None:
        got = token.encode()
        found = None
        for edge, tok in self._tokens:  # compare against every token: timing says nothing about which
            if hmac.compare_digest(got, tok):
                found = edge
        return found

    def caller(self, context: grpc.aio.ServicerContext) -> str:
        """Who is calling: the edge its token names (already checked), else its peer host."""
        header = dict(context.invocation_metadata() or ()).get("authorization", "")
        return (self.edge_of(header[7:].strip()) if header[:7].lower() == "bearer " else None) or peer_host(context)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        meta = dict(details.invocation_metadata or ())
        header = meta.get("authorization", "")
        if not header:
            message = "authorization: missing bearer token"
        elif header[:7].lower() != "bearer ":  # the scheme is case-insensitive (RFC 7235)
            message = "authorization: expected 'Bearer <token>'"
        elif self.edge_of(header[7:].strip()) is None:
            message = "authorization: unknown token"
        else:
            return handler
        log.warning("refused %s: %s", details.method, message)
        deny = _deny(message)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)


def peer_host(context: grpc.aio.ServicerContext) -> str:
    """The caller's address without its port ("ipv4:10.0.0.7:51234" -> "10.0.0.7")."""
    peer = context.peer() or "unknown"
    host = peer.split(":", 1)[1] if ":" in peer else peer
    return host.rsplit(":", 1)[0].strip("[]") or "unknown"
