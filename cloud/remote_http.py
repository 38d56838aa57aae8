"""HTTP to a vLLM OpenAI-compatible server, for ``coinfer.cloud.remote_engine``: one pooled ``httpx.AsyncClient``,
the server's API key as a bearer token, TLS checked against a CA file, and every failure as the error the cloud
acts on.

A request's failure says whose it is: the connection (the server down, restarting, unreachable: ``ServerGone``,
which the health watch hears of at once) or the server's answer (a 5xx: ``Unavailable``, the edge replays the
session elsewhere; a 4xx: the request's own fault, or a key the server refuses). A connection that did not
open is tried again (``EngineConfig.connect_retries``: httpx's transport retries only those), a request that
started never is: it may have run. Closing a response closes its connection, which is how vLLM's server hears
that a request was abandoned: it aborts it (``with_cancellation``, and the streaming response's disconnect).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from coinfer.cloud.config import EngineConfig
from coinfer.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 1024
"""Connections to the server at once: one per engine request in flight (a streamed generation holds its own)."""
ERROR_CHARS = 300
"""Of a server's error message, what an error here quotes."""


class WrongServer(Exception):
    """The server does not serve the target this replica tokenizes for (another model, another tokenizer):
    never used, whatever it answers."""


class KeyRefused(Unavailable):
    """The server refuses this replica's API key: every request would fail alike until the key is fixed."""


class ServerGone(Unavailable):
    """The connection to the server failed (refused, reset, timed out): the server is down, restarting or
    unreachable, not one request's problem."""


def api_key(cfg: EngineConfig) -> str:
    """The server's API key: ``cfg.api_key``, or ``cfg.key_file``'s contents; "" for none."""
    if cfg.key_file:
        return Path(cfg.key_file).read_text(encoding="utf-8").strip()
    return cfg.api_key


def client(cfg: EngineConfig, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The pooled client for ``cfg.url`` (``transport``: another than the network's, for tests). No read timeout:
    a request may wait its turn in the server's queue for as long as its session's deadline allows (the session
    cancels it there); connecting is bounded by the probe's timeout, a hung server is found by the health watch."""
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cfg.ca_file) if cfg.ca_file else True
    key = api_key(cfg)
    transport = transport or httpx.AsyncHTTPTransport(
        verify=verify,
        retries=cfg.connect_retries,  # connection failures only: ConnectError, ConnectTimeout
        # idle connections closed before the server would (uvicorn's keep-alive: 5 s), so that a request never
        # goes out on a connection the server is closing (a reset: the request failed, not the server)
        limits=httpx.Limits(
            max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS // 4, keepalive_expiry=3.0
        ),
    )
    # httpx logs a line per request at INFO (method, URL, status; never headers): one per engine request
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return httpx.AsyncClient(
        base_url=cfg.url.rstrip("/"),
        transport=transport,
        headers={"Authorization": f"Bearer {key}"} if key else {},
        timeout=httpx.Timeout(connect=cfg.probe_timeout_s, read=None, write=cfg.probe_timeout_s * 5, pool=None),
    )


def _message(body: bytes) -> str:
    """The message of a server's error body (vLLM's ``{"error": {"message": ...}}``, or older ``{"message"}``)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:ERROR_CHARS].decode("utf-8", "replace")
    err = data.get("error", data) if isinstance(data, dict) else data
    msg = err.get("message", err) if isinstance(err, dict) else err
    return str(msg)[:ERROR_CHARS]


def refused(status: int, body: bytes) -> Exception:
    """The error for a server's answer ``status`` (not 2xx)."""
    msg = _message(body)
    if status in (401, 403):  # the whole replica's problem, not the request's
        return KeyRefused(f"engine: the vLLM server refused this replica's API key ({status}): {msg}")
    if status == 404:  # another model (or none) behind the URL now: the health watch checks it again
        return ServerGone(f"engine: the vLLM server does not serve the target ({status}): {msg}")
    if status in (400, 422):
        return InvalidArgument(f"engine: the vLLM server refused the request ({status}): {msg}")
    return Unavailable(f"engine: the vLLM server failed the request ({status}): {msg}")


def gone(exc: httpx.TransportError) -> ServerGone:
    return ServerGone(f"engine: the vLLM server is unreachable ({type(exc).__name__}: {str(exc)[:ERROR_CHARS]})")


async def post(http: httpx.AsyncClient, path: str, body: dict, headers: dict | None = None) -> dict:
    """A non-streamed request's JSON answer."""
    try:
        r = await http.post(path, json=body, headers=headers)
    except httpx.TransportError as exc:
        raise gone(exc) from None
    if r.status_code != 200:
        raise refused(r.status_code, r.content)
    return r.json()


async def stream(http: httpx.AsyncClient, path: str, body: dict, headers: dict | None = None) -> AsyncIterator[dict]:
    """A streamed request's server-sent events, each parsed; the response (and so the request on the server)
    closed when the caller stops reading."""
    try:
        async with http.stream("POST", path, json=body, headers=headers) as r:
            if r.status_code != 200:
                raise refused(r.status_code, await r.aread())
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, ": keep-alive" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:  # failed after the stream began: vLLM sends the error as an event
                    err = event["error"]
                    raise refused(int(err.get("code") or 500), json.dumps(event).encode())
                yield event
    except httpx.TransportError as exc:
        raise gone(exc) from None


async def get(http: httpx.AsyncClient, path: str, timeout_s: float) -> httpx.Response:
    """A GET answered within ``timeout_s`` (any status), or ``ServerGone``."""
    try:
        return await http.get(path, timeout=timeout_s)
    except httpx.TransportError as exc:
        raise gone(exc) from None


@dataclass(frozen=True)
class ServerLoad:
    """What vLLM's ``/metrics`` says of its scheduler, summed over its engines (data parallel)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    """The fullest engine's KV-cache use in [0, 1]."""


METRICS = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}
KV_METRICS = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""The KV-cache gauge's name in vLLM's v1 engine, and before it."""


def server_load(text: str) -> ServerLoad:
    """vLLM's Prometheus exposition ``text`` (``name{labels} value`` lines) as a ``ServerLoad``; gauges it lacks
    read 0. Scanned, not parsed: the exposition is tens of KiB of histograms, read every probe on the loop."""
    sums = {"running": 0.0, "waiting": 0.0}
    kv = 0.0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in METRICS and name not in KV_METRICS:
            continue
        rest = line[len(name) :]
        try:
            value = float((rest[rest.rindex("}") + 1 :] if rest.startswith("{") else rest).split()[0])
        except (IndexError, ValueError):
            continue
        if name in METRICS:
            sums[METRICS[name]] += value
        else:
            kv = max(kv, value)
    return ServerLoad(int(sums["running"]), int(sums["waiting"]), min(1.0, max(0.0, kv)))
