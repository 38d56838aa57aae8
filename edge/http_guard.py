"""Slow and greedy HTTP clients cannot hold the edge's connections or file descriptors.

uvicorn times out an idle keep-alive connection but not one that trickles its request
headers, and it accepts connections until the process runs out of descriptors (then logs a
traceback per failed accept). This wraps uvicorn's own protocol class (``Config(http=...)``
takes a class) with the two guards it lacks:

- a header deadline: a connection that has not sent a complete request head within
  ``header_timeout_s`` of connecting, or of its previous response, is closed;
- a connection cap: a connection over ``max_connections`` is answered 503 with
  ``Retry-After`` and closed at once, so descriptors stay free for the ones being served.

Request bodies have their own deadline in the handler (``edge/http.py``).
"""

from __future__ import annotations

import asyncio
import resource

from uvicorn.config import Config

_BUSY_BODY = b'{"error": {"message": "connections: server at its limit", "type": "server_error", "param": null}}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


def max_connections(configured: int) -> int:
    """``configured``, or for 0 half the process's descriptor limit (the rest: models, gRPC, logs), at most 4096."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(4096, (soft if soft != resource.RLIM_INFINITY else 8192) // 2))


def install(config: Config, header_timeout_s: float, cap: int) -> None:
    """Replace ``config``'s HTTP protocol class (httptools or h11, as uvicorn chose) by a guarded
    subclass; the server then uses it since the config is already loaded."""
    if not config.loaded:
        config.load()
    base = config.http_protocol_class

    class Guarded(base):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap:
                transport.write(_BUSY)
                transport.close()
                return
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout)

        def _head_timeout(self) -> None:
            waiting_for_head = self.cycle is None or self.cycle.response_complete
            if waiting_for_head and not self.transport.is_closing():
                self.transport.close()

    Guarded.__name__ = f"Guarded{base.__name__}"
    config.http_protocol_class = Guarded
