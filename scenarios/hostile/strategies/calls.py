"""The generated calls: gRPC calls with metadata, session streams, and HTTP bodies and headers
(``GrpcCall``, ``HttpCall``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from hypothesis import strategies as st

from coinfer.v1 import coinfer_pb2 as pb
from scenarios.hostile.strategies.inputs import (
    NUMS,
    PROMPTS,
    REGEXES,
    RULES_JSON,
    SHALLOW_SCHEMAS,
    VALID_PROBLEMS,
    draft,
    mostly,
    session_open,
)
from scenarios.hostile.strategies.values import (
    CHEAP_DEADLINE_MS,
    CHEAP_TOKENS,
    MODEL,
    ints,
    json_values,
    text,
    weighted,
)
from scenarios.hostile.strategies.wire import request_bytes

# ---- requests -------------------------------------------------------------------------------------------

_KEY = st.from_regex(r"[a-z][a-z0-9_.-]{0,15}", fullmatch=True).filter(
    lambda k: not k.startswith("grpc") and not k.endswith("-bin") and k not in ("te", "content-type", "user-agent")
)
METADATA = weighted(
    (4, st.lists(st.tuples(_KEY, st.from_regex(r"[ -~]{0,40}", fullmatch=True).map(str.strip)), max_size=3)),
    (1, st.builds(lambda n: [("authorization", "Bearer " + "x" * n)], st.just(20_000))),
)
"""Request metadata: stray keys and values, and one header past gRPC's default 8 KiB metadata limit."""


@dataclass(frozen=True)
class GrpcCall:
    """One RPC: a serialised request (a list of them for a client stream) and its metadata."""

    requests: bytes | tuple[bytes, ...]
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HttpCall:
    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    params: tuple[tuple[str, str], ...] = ()


def grpc_calls(requests: st.SearchStrategy) -> st.SearchStrategy[GrpcCall]:
    meta = weighted((19, st.just([])), (1, METADATA))
    return st.builds(lambda r, m: GrpcCall(tuple(r) if isinstance(r, list) else r, tuple(m)), requests, meta)


def session_stream() -> st.SearchStrategy[list[bytes]]:
    """A Session's messages: usually open, drafts, done (counts right or wrong); else any sequence
    (no open, two opens, drafts after done, thousands of drafts), each message possibly malformed."""

    def msg(kind: str, value: Message) -> bytes:
        return pb.EdgeMessage(**{kind: value}).SerializeToString()

    opened = request_bytes(pb.EdgeMessage.DESCRIPTOR, session_open().map(lambda o: pb.EdgeMessage(open=o)))
    drafted = draft().map(lambda d: msg("draft", d))
    done = ints(0, 2**32 - 1).map(lambda n: msg("done", pb.DraftsDone(count=n)))

    def usual(o: bytes, drafts: list[pb.Draft], count: int | None) -> list[bytes]:
        ds = [
            msg("draft", pb.Draft(index=i, text=d.text, num_tokens=d.num_tokens, mean_logprob=d.mean_logprob))
            for i, d in enumerate(drafts)
        ]
        return [o, *ds, msg("done", pb.DraftsDone(count=len(ds) if count is None else count))]

    one = st.one_of(opened, drafted, done)
    return weighted(
        (8, st.builds(usual, opened, st.lists(draft(), max_size=5), mostly(st.none(), ints(0, 2**32 - 1)))),
        (2, st.lists(one, max_size=6)),
        (
            1,
            st.builds(
                lambda o, t, n: [o] + [msg("draft", pb.Draft(index=i, text=t)) for i in range(n)],
                opened,
                text(16, big=False),
                st.sampled_from((17, 100, 1000)),
            ),
        ),
    )


def http_text(max_size: int = 64) -> st.SearchStrategy[str]:
    return text(max_size, surrogates=True)


def rules_json() -> st.SearchStrategy[list]:
    """Rules as the HTTP API takes them: mostly valid ones that run a client's regex or schema on the drafts."""
    runtime = st.one_of(
        st.builds(lambda p: {"kind": "regex", "params": {"pattern": p}}, REGEXES),
        st.builds(lambda sc: {"kind": "json_schema", "params": {"schema": sc}}, SHALLOW_SCHEMAS),
        st.sampled_from(({"kind": "arithmetic"}, {"kind": "length", "params": {"max": 512}})),
    )
    small = st.builds(lambda p: {"kind": "regex", "params": {"pattern": p}}, text(8, big=False))
    return weighted(
        (3, st.lists(runtime, min_size=1, max_size=2)),
        (1, st.lists(RULES_JSON, max_size=3)),
        (1, st.builds(lambda r, n: [r] * n, small, st.sampled_from((65, 1000)))),
    )


def coinfer_extra() -> st.SearchStrategy:
    extraction = mostly(
        st.one_of(
            st.sampled_from(("none", "marker", "boxed", "last_line", "json")),
            st.builds(lambda p: {"kind": "regex", "pattern": p}, REGEXES),
        ),
        st.one_of(
            st.sampled_from(("regex", "", "MARKER")),
            json_values(4),
            st.fixed_dictionaries(
                {"kind": st.sampled_from(("regex", "marker", "json", "x"))},
                optional={"pattern": REGEXES, "marker": http_text(16), "x": json_values(2)},
            ),
        ),
    )
    extra = st.fixed_dictionaries(
        {},
        optional={
            "task": mostly(st.sampled_from(("", "arith", "select")), st.just("poetry") | json_values(2)),
            "extraction": extraction,
            "rules": mostly(rules_json(), json_values(4)),
            "plan": mostly(st.sampled_from(("auto", "edge", "split", "cloud")), st.just("moon") | json_values(2)),
            "num_drafts": mostly(st.integers(0, 8), NUMS),
            "deadline_ms": mostly(st.integers(*CHEAP_DEADLINE_MS), NUMS),
            "unknown": json_values(2),
        },
    )
    return weighted((6, extra), (1, json_values(6, surrogates=True)))


def _cheap_body(body: Any, tokens: int, ms: int) -> Any:
    """A body's valid budget knobs (or their absence: the daemon's defaults) made cheap."""
    if not isinstance(body, dict):
        return body
    mt = body.get("max_tokens")
    if mt is None or (isinstance(mt, int) and not isinstance(mt, bool) and 1 <= mt <= 4096):
        body["max_tokens"] = tokens
    x = body.get("coinfer")
    if isinstance(x, dict):
        d = x.get("deadline_ms")
        if d is None or (isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 600_000):
            x["deadline_ms"] = ms
    elif "coinfer" not in body:
        body["coinfer"] = {"deadline_ms": ms}
    return body


def openai_body(chat: bool, stream: bool) -> st.SearchStrategy[Any]:
    """An OpenAI request, each field mostly valid, else hostile (a wrong kind, an extreme, a lone surrogate);
    sometimes with its model missing, or any JSON at all."""
    prompt = mostly(VALID_PROBLEMS.map(lambda p: p[1]), PROMPTS | http_text() | json_values(4))
    message_ = st.fixed_dictionaries(
        {
            "role": mostly(
                st.just("user"), st.sampled_from(("system", "assistant", "developer", "tool")) | json_values(2)
            ),
            "content": prompt,
        },
        optional={"name": json_values(2)},
    )
    content = (
        {"messages": mostly(st.lists(message_, min_size=1, max_size=3), json_values(4))} if chat else {"prompt": prompt}
    )

    def num(lo: float, hi: float) -> st.SearchStrategy:
        return mostly(st.floats(lo, hi), NUMS)

    optional = {
        "max_tokens": mostly(st.integers(*CHEAP_TOKENS), NUMS),
        "temperature": num(0, 2),
        "top_p": num(0.01, 1),
        "presence_penalty": num(-2, 2),
        "frequency_penalty": num(-2, 2),
        "seed": mostly(st.integers(0, 1000), NUMS),
        "stop": mostly(st.sampled_from((";", ["\n", "answer"])), st.lists(http_text(70), max_size=9) | json_values(2)),
        "n": mostly(st.just(1), NUMS),
        "coinfer": coinfer_extra(),
        "logprobs": json_values(2),
        "extra_field": json_values(4),
    }
    model = weighted((8, st.just(MODEL)), (1, http_text(16)), (1, json_values(2)))
    body = st.fixed_dictionaries({"model": model} | content, optional=optional).map(lambda b: b | {"stream": stream})
    shaped = weighted(
        (8, body),
        (1, body.map(lambda b: {k: v for k, v in b.items() if k != "model"})),
        (1, json_values(8, surrogates=True)),
    )
    return st.builds(_cheap_body, shaped, st.integers(*CHEAP_TOKENS), st.integers(*CHEAP_DEADLINE_MS))


def _dumps(body: Any) -> bytes:
    return json.dumps(body).encode()  # NaN / Infinity as Python writes them; lone surrogates as \\udXXX escapes


RAW_BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        (
            b"",
            b"{",
            b"{not json",
            b"null",
            b"[]",
            b"\xff\xfe{\x00}\x00",
            b"\xef\xbb\xbf{}",
            b'{"model": "\xff"}',
            b'{"model": "coinfer-edge", "prompt": "\xed\xa0\x80"}',
            b'{"model": "coinfer-edge", "prompt": "\\ud800"}',
            b'{"model": "coinfer-edge", "messages": [{"role": "user", "content": "\\udfff\\ud800"}]}',
            b'{"model": "coinfer-edge", "prompt": "hi", "max_tokens": 1e999}',
            b'{"a": 1, "a": 2}',
            b'{"model": "coinfer-edge", "prompt": "x", "coinfer": {"rules": [{"kind": "regex", "params": '
            b'{"pattern": "(a+)+$"}}]}}',
        )
    ),
    st.builds(lambda n: b"1" * n, st.sampled_from((4300, 4301, 5000))),
    st.builds(
        lambda n: b'{"model": "coinfer-edge", "prompt": "x", "max_tokens": ' + b"9" * n + b"}",
        st.sampled_from((4301, 10_000)),
    ),
    st.builds(
        lambda u, n: u * n, st.sampled_from((b"[", b'{"a":', b"[" * 1)), st.sampled_from((1000, 100_000, 1 << 20))
    ),
    st.builds(lambda n: b"[" * n + b"]" * n, st.sampled_from((500, 1000, 5000, 100_000))),
    st.builds(
        lambda n: (
            b'{"model": "coinfer-edge", "prompt": "x", "coinfer": {"rules": [{"kind": "json_schema", "params": '
            b'{"schema": ' + b'{"not": ' * n + b"{}" + b"}" * n + b"}}]}}"
        ),
        st.sampled_from((30, 500, 900, 3000)),
    ),
    st.builds(lambda n: b'{"model": "coinfer-edge", "prompt": "' + b"a" * n + b'"}', st.sampled_from(((1 << 20) + 1,))),
)


def http_posts(path: str, chat: bool, stream: bool) -> st.SearchStrategy[HttpCall]:
    body = weighted((8, openai_body(chat, stream).map(_dumps)), (2, RAW_BODIES))
    odd = st.sampled_from(
        (
            (("content-type", "text/plain"),),
            (("content-type", "application/json; charset=utf-16"),),
            (("content-encoding", "gzip"),),
        )
    )
    big = st.builds(lambda n: (("x-junk", "y" * n),), st.just(20_000))  # built: a literal would bloat reprs
    headers = weighted((16, st.just(())), (1, odd), (1, big))
    return st.builds(lambda b, h: HttpCall("POST", path, b, h), body, headers)


def http_gets(path: str) -> st.SearchStrategy[HttpCall]:
    key = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True).filter(
        lambda k: k.lower() not in ("host", "content-length", "transfer-encoding", "connection")
    )
    value = st.from_regex(r"[ -~]{0,64}", fullmatch=True).map(str.strip)  # edge spaces: the client refuses them
    headers = weighted(
        (9, st.lists(st.tuples(key, value), max_size=3)),
        (1, st.builds(lambda n: [("x-junk", "y" * n)], st.just(70_000))),
    )
    params = st.lists(st.tuples(text(8, big=False), text(16, big=False)), max_size=3)
    method = weighted((8, st.just("GET")), (1, st.sampled_from(("HEAD", "POST", "DELETE", "OPTIONS"))))
    return st.builds(
        lambda m, h, p, b: HttpCall(m, path, b, tuple(h), tuple(p)),
        method,
        headers,
        params,
        st.none() | st.binary(max_size=32),
    )
