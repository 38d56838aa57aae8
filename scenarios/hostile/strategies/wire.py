"""Any protobuf message, built from the descriptors, and the wire level below it: hand-written and mutated
bytes (varints, tags, deep nesting)."""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import edge_pb2 as epb
from scenarios.hostile.strategies.inputs import cheap, fits_struct, make_rule, struct_of
from scenarios.hostile.strategies.values import FD, INT_RANGES, SIZES, floats, ints, json_values, nest, text, weighted

# ---- messages from descriptors ---------------------------------------------------------------------------


def _build(cls: type, values: dict[str, Any]) -> Message:
    msg = cls()
    for f in cls.DESCRIPTOR.fields:
        if f.name not in values:
            continue
        v = values[f.name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            getattr(msg, f.name).update(v)
        elif f.is_repeated:
            getattr(msg, f.name).extend(v)
        elif f.message_type is not None:
            getattr(msg, f.name).CopyFrom(v)
        else:
            setattr(msg, f.name, v)
    return msg


def _scalar(f: FieldDescriptor, big: bool) -> st.SearchStrategy:
    if f.type in INT_RANGES:
        return ints(*INT_RANGES[f.type])
    if f.type == FD.TYPE_BOOL:
        return st.booleans()
    if f.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return floats(32 if f.type == FD.TYPE_FLOAT else 64)
    if f.type == FD.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), ints(-(2**31), 2**31 - 1))
    if f.type == FD.TYPE_BYTES:
        return weighted((9, st.binary(max_size=64)), (1 if big else 0, st.builds(bytes, SIZES)))
    return text(32, big=big)


def _field(f: FieldDescriptor, big: bool = True) -> st.SearchStrategy:
    mt = f.message_type
    if mt is not None and mt.GetOptions().map_entry:
        return st.dictionaries(
            _scalar(mt.fields_by_name["key"], False), _scalar(mt.fields_by_name["value"], False), max_size=4
        )
    one = message(mt, big) if mt is not None else _scalar(f, big)
    if not f.is_repeated:
        return one
    small = message(mt, False) if mt is not None else _scalar(f, False)
    # many entries of a small element: thousands of rules, stop strings, messages
    return weighted(
        (9, st.lists(one, max_size=4)),
        (1, st.builds(lambda x, n: [x] * n, small, st.sampled_from((9, 65, 1000, 10_000)))),
    )


@functools.cache
def message(desc: Descriptor, big: bool = True) -> st.SearchStrategy[Message]:
    """Any message of type ``desc``: each field unset or any value of its type (Struct: any JSON object)."""
    if desc.full_name == "google.protobuf.Struct":
        return st.dictionaries(text(8, big=False), json_values(6), max_size=4).filter(fits_struct).map(struct_of)
    cls = message_factory.GetMessageClass(desc)
    return st.fixed_dictionaries({}, optional={f.name: _field(f, big) for f in desc.fields}).map(
        lambda kw: _build(cls, kw)
    )


# ---- the wire level --------------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative: ten bytes of two's complement, as protobuf writes them
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def delimited(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


BAD_UTF8 = (
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xc0\x80",
    b"\xe0\x80\xaf",
    b"\xfe\xff",
    b"a\x80b",
)
"""Invalid UTF-8: a stray byte, a cut sequence, UTF-16 surrogates (CESU-8), past U+10FFFF, overlong forms."""


def _wire_field(f: FieldDescriptor, depth: int) -> st.SearchStrategy[bytes]:
    n = f.number
    if f.type in (FD.TYPE_STRING, FD.TYPE_BYTES):
        good = text(16, big=False).map(str.encode)
        bad = st.tuples(st.text(max_size=4), st.sampled_from(BAD_UTF8), st.text(max_size=4)).map(
            lambda p: p[0].encode() + p[1] + p[2].encode()
        )
        return st.one_of(good, bad).map(lambda b: delimited(n, b))
    if f.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        inner = wire(f.message_type, depth + 1) if depth < 4 else st.binary(max_size=8)
        return inner.map(lambda b: delimited(n, b))
    if f.type in (FD.TYPE_FLOAT, FD.TYPE_FIXED32, FD.TYPE_SFIXED32):
        return st.binary(min_size=4, max_size=4).map(lambda b: tag(n, 5) + b)
    if f.type in (FD.TYPE_DOUBLE, FD.TYPE_FIXED64, FD.TYPE_SFIXED64):
        return st.binary(min_size=8, max_size=8).map(lambda b: tag(n, 1) + b)
    any_int = ints(-(2**63), 2**64 - 1)  # whatever the declared width: the parser truncates
    packed = st.lists(any_int, max_size=8).map(lambda xs: delimited(n, b"".join(varint(x) for x in xs)))
    return st.one_of(any_int.map(lambda x: tag(n, 0) + varint(x)), packed)


def deep_rule(path: tuple[int, ...]) -> st.SearchStrategy[bytes]:
    """A rule whose params nest around protobuf's parse limit (100 messages; a Struct level takes three),
    serialised under ``path`` (field numbers from the request down to ``Problem.rules``): appended to a
    serialised request it merges into its problem (a message's copy would refuse it)."""

    def wrap(params: dict) -> bytes:
        b = make_rule("json_schema" if "schema" in params else "membership", params).SerializeToString()
        for n in reversed(path):
            b = delimited(n, b)
        return b

    depth = st.sampled_from((20, 32, 40, 100))
    return st.one_of(
        st.builds(lambda d: wrap({"schema": nest(d, {}, "not")}), depth),
        st.builds(lambda d: wrap({"field": "answer", "values": nest(d, 1, None)}), depth),
    )


HOSTILE_WIRE = st.one_of(
    st.builds(lambda n, wt: tag(n, wt), st.integers(1, 2**29 - 1), st.integers(0, 7)),  # a tag, no value
    st.builds(lambda n, b: delimited(n, b), st.integers(1, 2**29 - 1), st.binary(max_size=16)),  # unknown field
    st.sampled_from(
        (
            b"\x00",
            b"\x08" + b"\xff" * 11,
            b"\x0a\xff\xff\xff\xff\x0f",
            b"\x0a\x05ab",
            b"\x0b",
            b"\x0c",
            tag(19000, 0) + b"\x01",
            tag(0, 2) + b"\x00",
        )
    ),  # field 0, overlong varint, a length past the end, groups
)


def wire(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[bytes]:
    """A serialisation of ``desc`` written by hand: each field with a value of its type or a
    malformed one (invalid UTF-8, a wrong width, any varint), in any order and repeated, with
    unknown fields and malformed tags mixed in."""
    fields_ = [_wire_field(f, depth) for f in desc.fields]
    parts = st.lists(st.one_of(*fields_, HOSTILE_WIRE) if fields_ else HOSTILE_WIRE, max_size=6)
    return parts.map(b"".join)


ALL_MESSAGES = [d for f in (pb.DESCRIPTOR, epb.DESCRIPTOR) for d in f.message_types_by_name.values()]


def mutated(serialised: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """A valid serialisation cut short, with bytes flipped, or with garbage after it."""

    def cut(b: bytes, k: int) -> bytes:
        return b[: k % max(1, len(b))]

    def flip(b: bytes, k: int, x: int) -> bytes:
        if not b:
            return bytes([x])
        i = k % len(b)
        return b[:i] + bytes([b[i] ^ x]) + b[i + 1 :]

    k, x = st.integers(0, 2**16), st.integers(1, 255)
    return st.one_of(
        st.builds(cut, serialised, k),
        st.builds(flip, serialised, k, x),
        st.builds(bytes.__add__, serialised, st.binary(min_size=1, max_size=8)),
    )


COSTLY = ("SessionOpen", "GenerateRequest", "SolveRequest", "EdgeMessage")
"""Requests whose valid forms run the engines: their typed messages are made cheap as well."""


RULES_PATH = {"GenerateRequest": (2, 3), "SolveRequest": (2, 3), "EdgeMessage": (1, 2, 3)}
"""Field numbers from a request down to ``Problem.rules``."""


def request_bytes(desc: Descriptor, semantic: st.SearchStrategy[Message] | None = None) -> st.SearchStrategy[bytes]:
    """Bytes for an RPC taking ``desc``: near-valid requests with hostile payloads (``semantic``; some
    with a deeply nested rule), any typed message, hand-written wire, mutated serialisations, foreign
    messages and garbage."""
    typed = (cheap(message(desc)) if desc.name in COSTLY else message(desc)).map(lambda m: m.SerializeToString())
    good = semantic.map(lambda m: m.SerializeToString()) if semantic is not None else typed
    if desc.name in RULES_PATH:
        good = weighted((6, good), (1, st.builds(bytes.__add__, good, deep_rule(RULES_PATH[desc.name]))))
    foreign = (
        st.sampled_from(ALL_MESSAGES).flatmap(lambda d: message(d, big=False)).map(lambda m: m.SerializeToString())
    )
    return weighted(
        (12 if semantic is not None else 0, good),
        (3, typed),
        (3, wire(desc)),
        (2, mutated(good)),
        (1, foreign),
        (1, st.binary(max_size=64)),
    )
