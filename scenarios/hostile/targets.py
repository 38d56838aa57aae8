"""Where the inputs go and what each answer means: the servers' addresses and the campaign's connections
(``Endpoints``, ``Clients``), one sender per RPC and endpoint (``targets()``), the classification of every
answer (``verdict``, ``leaks``, ``Tally``) and ``run_target``, which feeds a target its generated examples."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from google.protobuf import text_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import edge_pb2 as epb
from scenarios.hostile.strategies.calls import GrpcCall, HttpCall, grpc_calls, http_gets, http_posts, session_stream
from scenarios.hostile.strategies.inputs import REQUEST_IDS, cheap, mostly, problem, sampling
from scenarios.hostile.strategies.values import CHEAP_DEADLINE_MS, SIZES, ints, text, weighted
from scenarios.hostile.strategies.wire import request_bytes

# ---- targets --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: str
    """gRPC status name ("OK", "INVALID_ARGUMENT", ...), "HTTP <status>", "TIMEOUT" or "BROKEN"."""
    message: str = ""
    texts: list[str] = field(default_factory=list)
    """Server-written text of a successful answer (errors, traces, fallback reasons) to scan for leaks."""


@dataclass
class Endpoints:
    cloud: str
    edge_grpc: str
    edge_http: str


class Clients:
    """The campaign's connections (an aio channel per server, one HTTP client)."""

    def __init__(self, ep: Endpoints) -> None:
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        self.cloud = grpc.aio.insecure_channel(ep.cloud, options=opts)
        self.edge = grpc.aio.insecure_channel(ep.edge_grpc, options=opts)
        # a connection per request: one closed after an answer (a 500) must not fail the next request on it
        self.http = httpx.AsyncClient(
            base_url=ep.edge_http,
            timeout=httpx.Timeout(120.0),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=0),
        )

    async def close(self) -> None:
        await self.cloud.close()
        await self.edge.close()
        await self.http.aclose()


def _texts(msg: Message) -> list[str]:
    """The server-written strings of a response message (errors, traces, reasons)."""
    out: list[str] = []
    for f, v in msg.ListFields():
        if f.name in ("error", "trace", "reason", "fallback_reason", "plan_reason", "why", "replays"):
            out.extend(v if f.is_repeated else [v])
        elif f.message_type is not None and not f.message_type.GetOptions().map_entry and f.name != "fields":
            for m in v if f.is_repeated else [v]:
                out.extend(_texts(m))
    return out


CLIENT_RACE = "Internal error from Core"
"""What grpc.aio's client reports when it writes to a stream the server has just closed: its own
write failure replaces the server's status (the server never sends this)."""


async def _bidi(stub: Any, call: GrpcCall, timeout: float, meta: Any, pace_s: float) -> list[Message]:
    """A client stream written message by message (``pace_s`` apart), stopping once the server has ended
    the call; the replies, or the server's status raised."""
    rpc = stub(timeout=timeout, metadata=meta)

    async def write() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):  # the reader gets the status
            for r in call.requests:
                await asyncio.sleep(pace_s)
                if rpc.done():
                    return
                await rpc.write(r)
            await rpc.done_writing()

    writer = asyncio.create_task(write())
    try:
        return [r async for r in rpc]
    finally:
        await writer


async def _grpc(
    channel: grpc.aio.Channel, method: str, kind: str, reply: type, call: GrpcCall, timeout: float
) -> Outcome:
    ident = lambda b: b  # noqa: E731 - requests travel exactly as generated
    stub = getattr(channel, kind)(method, request_serializer=ident, response_deserializer=reply.FromString)
    meta = call.metadata or None

    async def once(pace_s: float) -> Outcome:
        try:
            if kind == "unary_unary":
                replies = [await stub(call.requests, timeout=timeout, metadata=meta)]
            elif kind == "unary_stream":
                replies = [r async for r in stub(call.requests, timeout=timeout, metadata=meta)]
            else:
                replies = await _bidi(stub, call, timeout, meta, pace_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and exc.details() == "Deadline Exceeded":
                return Outcome("TIMEOUT", f"no answer within the client's {timeout:g} s")
            return Outcome(exc.code().name, exc.details() or "")
        return Outcome("OK", texts=[s for r in replies for s in _texts(r)])

    out = await once(0.0)
    for pace_s in (0.02, 0.2):  # paced: each write waits for the server to have answered the one before
        if kind != "stream_stream" or out.message != CLIENT_RACE:
            break
        out = await once(pace_s)
    return out


async def _http(client: httpx.AsyncClient, call: HttpCall, timeout: float) -> Outcome:
    try:
        async with asyncio.timeout(timeout):
            req = client.build_request(
                call.method, call.path, content=call.body, headers=list(call.headers), params=list(call.params)
            )
            resp = await client.send(req, stream=True)
            try:
                lines = [line async for line in resp.aiter_lines()]
            finally:
                await resp.aclose()
    except TimeoutError:
        return Outcome("TIMEOUT", f"no answer within the client's {timeout:g} s")
    except httpx.HTTPError as exc:  # the server dropped the connection (or broke the protocol)
        return Outcome("BROKEN", f"{type(exc).__name__}: {exc}")
    body = "\n".join(lines)
    if resp.headers.get("content-type", "").startswith("text/event-stream") and resp.status_code == 200:
        if not lines or "data: [DONE]" not in lines:  # a stream must end properly, not be cut
            return Outcome("BROKEN", f"event stream ended without [DONE]: {body[-200:]!r}")
    return Outcome(
        f"HTTP {resp.status_code}",
        body[:2000] if resp.status_code >= 400 else "",
        texts=[body] if resp.status_code < 400 else [],
    )


Sender = Callable[[Clients, Any, float], Awaitable[Outcome]]


@dataclass(frozen=True)
class Target:
    name: str
    inputs: st.SearchStrategy
    send: Sender
    request: type | None = None
    """The request message type of a gRPC target (to show its examples)."""


def _rpc(which: str, service: str, method: str, kind: str, reply: type) -> Sender:
    path = f"/coinfer.v1.{service}/{method}"

    def send(c: Clients, call: GrpcCall, timeout: float) -> Awaitable[Outcome]:
        return _grpc(getattr(c, which), path, kind, reply, call, timeout)

    return send


def _web(c: Clients, call: HttpCall, timeout: float) -> Awaitable[Outcome]:
    return _http(c.http, call, timeout)


def targets() -> list[Target]:
    deadline = mostly(st.integers(*CHEAP_DEADLINE_MS), ints(0, 2**32 - 1))
    solve = cheap(
        st.builds(
            epb.SolveRequest,
            request_id=REQUEST_IDS,
            problem=problem(),
            sampling=sampling(),
            num_drafts=mostly(st.integers(0, 8), ints(0, 2**32 - 1)),
            plan=mostly(st.sampled_from(("", "auto", "edge", "split", "cloud")), text(8)),
            deadline_ms=deadline,
        )
    )
    generate = cheap(
        st.builds(
            pb.GenerateRequest, request_id=REQUEST_IDS, problem=problem(), sampling=sampling(), deadline_ms=deadline
        )
    )
    probe = st.builds(
        pb.ProbeRequest,
        payload=weighted((4, st.binary(max_size=64)), (1, st.builds(bytes, SIZES))),
        response_bytes=ints(0, 2**32 - 1),
    )

    def calls(desc: Descriptor, semantic: st.SearchStrategy | None = None) -> st.SearchStrategy[GrpcCall]:
        return grpc_calls(request_bytes(desc, semantic))

    return [
        Target(
            "cloud.Status",
            calls(pb.StatusRequest.DESCRIPTOR),
            _rpc("cloud", "CoinferCloud", "Status", "unary_unary", pb.StatusResponse),
            pb.StatusRequest,
        ),
        Target(
            "cloud.Probe",
            calls(pb.ProbeRequest.DESCRIPTOR, probe),
            _rpc("cloud", "CoinferCloud", "Probe", "unary_unary", pb.ProbeResponse),
            pb.ProbeRequest,
        ),
        Target(
            "cloud.Generate",
            calls(pb.GenerateRequest.DESCRIPTOR, generate),
            _rpc("cloud", "CoinferCloud", "Generate", "unary_stream", pb.CloudMessage),
            pb.GenerateRequest,
        ),
        Target(
            "cloud.Session",
            grpc_calls(session_stream()),
            _rpc("cloud", "CoinferCloud", "Session", "stream_stream", pb.CloudMessage),
            pb.EdgeMessage,
        ),
        Target(
            "edge.Solve",
            calls(epb.SolveRequest.DESCRIPTOR, solve),
            _rpc("edge", "CoinferEdge", "Solve", "unary_stream", epb.SolveEvent),
            epb.SolveRequest,
        ),
        Target(
            "edge.Status",
            calls(epb.EdgeStatusRequest.DESCRIPTOR),
            _rpc("edge", "CoinferEdge", "Status", "unary_unary", epb.EdgeStatus),
            epb.EdgeStatusRequest,
        ),
        Target("http.chat", http_posts("/v1/chat/completions", True, False), _web),
        Target("http.chat.stream", http_posts("/v1/chat/completions", True, True), _web),
        Target("http.completions", http_posts("/v1/completions", False, False), _web),
        Target("http.completions.stream", http_posts("/v1/completions", False, True), _web),
        Target("http.models", http_gets("/v1/models"), _web),
        Target("http.healthz", http_gets("/healthz"), _web),
    ]


# ---- classification -------------------------------------------------------------------------------------

LEAK = re.compile(
    r"Traceback \(most recent call last\)|File \"[^\"]*\", line \d+|<class '|object at 0x[0-9a-f]+"
    r"|\b[A-Z][A-Za-z0-9]*(?:Error|Exception)\b|\b[\w-]+\.py\b|site-packages|\.cache/"
    r"|(?<![\w.:/])/(?:home|root|usr|tmp|var|opt|etc|proc|srv|mnt|work|lib\w*)/[^\s'\"]*"
)
"""What a client must not learn: a traceback, a Python class or exception name, a filesystem path."""
EXAMPLES_KEPT = 3
SERVER_FAULTS = {"INTERNAL", "UNKNOWN", "DATA_LOSS", "UNIMPLEMENTED", "TIMEOUT", "BROKEN"}


def describe(example: Any, request: type | None = None) -> str:
    """A short readable form of an example (the repro, with the seed): a message of type ``request`` that
    round-trips is shown as text, anything else as bytes."""
    if isinstance(example, GrpcCall):
        reqs = example.requests if isinstance(example.requests, tuple) else (example.requests,)
        shown = [_short(r, request) for r in reqs[:4]] + ([f"... {len(reqs)} messages"] if len(reqs) > 4 else [])
        return "; ".join(shown) + (
            f" metadata={[(k, v[:40]) for k, v in example.metadata]}" if example.metadata else ""
        )
    body = example.body or b""
    return (
        f"{example.method} {example.path} params={list(example.params)[:3]} "
        f"headers={[(k, v[:40]) for k, v in example.headers]} body[{len(body)}]={body[:300]!r}"
    )


def _short(raw: bytes, request: type | None) -> str:
    try:
        msg = request.FromString(raw) if request is not None and raw else None
    except DecodeError:
        msg = None
    if msg is None or msg.SerializeToString() != raw:
        return f"bytes[{len(raw)}]={raw[:120]!r}"
    shown = text_format.MessageToString(msg, as_one_line=True)
    return f"{request.__name__}{{{shown[:300]}{'...' if len(shown) > 300 else ''}}}"


def leaks(texts: list[str], example: Any) -> list[str]:
    """Leaky fragments in the server's texts that the request did not carry itself."""
    if isinstance(example, GrpcCall):
        reqs = example.requests if isinstance(example.requests, tuple) else (example.requests,)
        sent = b"".join(reqs).decode("utf-8", "replace")
    else:
        sent = (example.body or b"").decode("utf-8", "replace")
        try:  # a JSON body's strings as the server read them (escapes decoded)
            sent += json.dumps(json.loads(sent), ensure_ascii=False)
        except (ValueError, RecursionError):
            pass
    return [m.group(0) for t in texts for m in LEAK.finditer(t) if m.group(0) not in sent]


def verdict(out: Outcome, example: Any) -> tuple[str, list[str]]:
    """("ok" | "failure" | "unavailable", leaked fragments)."""
    bad = leaks(([out.message] if out.message else []) + out.texts, example)
    status = out.code.removeprefix("HTTP ")
    if out.code in SERVER_FAULTS or (status.isdigit() and int(status) >= 500 and status != "503"):
        return "failure", bad
    if out.code == "UNAVAILABLE" or status == "503":
        return "unavailable", bad
    return ("failure" if bad else "ok"), bad


@dataclass
class Tally:
    """Counts per target and code, and the first examples of each distinct failure (several: an HTTP 500
    says nothing of its cause, so one group may hold different bugs)."""

    counts: dict[str, Counter] = field(default_factory=dict)
    groups: dict[str, dict[tuple, dict]] = field(default_factory=lambda: {"failure": {}, "unavailable": {}})
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, target: Target, out: Outcome, example: Any) -> None:
        self.counts.setdefault(target.name, Counter())[out.code] += 1
        kind, bad = verdict(out, example)
        if kind == "ok":
            return
        what = f"leak {sorted(set(bad))}" if bad and kind == "failure" and out.code not in SERVER_FAULTS else out.code
        key = (target.name, what, re.sub(r"\d+", "N", out.message)[:60])
        g = self.groups[kind].setdefault(
            key,
            {
                "target": target.name,
                "code": out.code,
                "what": what,
                "count": 0,
                "message": out.message[:400],
                "leaks": sorted(set(bad))[:5],
                "examples": [],
            },
        )
        g["count"] += 1
        if len(g["examples"]) < EXAMPLES_KEPT:
            g["examples"].append(describe(example, target.request)[:800])

    @property
    def failures(self) -> list[dict]:
        return list(self.groups["failure"].values())

    def report(self) -> dict:
        return {
            "targets": {
                name: {
                    "examples": sum(c.values()),
                    "seconds": round(self.seconds.get(name, 0.0), 1),
                    "codes": dict(c.most_common()),
                }
                for name, c in self.counts.items()
            },
            **{kind: list(g.values()) for kind, g in self.groups.items()},
        }


# ---- the runner -----------------------------------------------------------------------------------------

_END = object()


def _generate(strategy: st.SearchStrategy, n: int, seed: int, put: Callable[[Any], None]) -> None:
    """Feed ``n`` examples of ``strategy`` (hypothesis' generation phase, seeded) to ``put``."""

    @hypothesis_seed(seed)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        put(example)

    collect()


def target_seed(seed: int, name: str) -> int:
    return seed * 1_000_003 + zlib.crc32(name.encode())


async def run_target(
    target: Target, clients: Clients, n: int, seed: int, tally: Tally, concurrency: int = 4, timeout: float = 60.0
) -> None:
    """Send ``n`` generated examples to ``target`` (``concurrency`` at a time) and classify each answer.
    Generation runs in a thread, a few examples ahead of the senders."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue(maxsize=2 * concurrency)

    def put(item: Any) -> None:
        asyncio.run_coroutine_threadsafe(q.put(item), loop).result()

    def produce() -> None:
        try:
            _generate(target.inputs, n, target_seed(seed, target.name), put)
        finally:
            for _ in range(concurrency):
                put(_END)

    async def worker() -> None:
        while (example := await q.get()) is not _END:
            tally.add(target, await target.send(clients, example, timeout), example)

    t0 = time.perf_counter()
    producer = threading.Thread(target=produce, name=f"gen-{target.name}", daemon=True)
    producer.start()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await asyncio.to_thread(producer.join)
    tally.seconds[target.name] = time.perf_counter() - t0
