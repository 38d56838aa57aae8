"""coinfer.v1 protobuf <-> domain dataclasses (``coinfer.types``), both directions.

One generic converter: dataclass fields and protobuf fields share names. The
special cases are the protocol's "zero means default" fields (seed 0 = None,
top_p 0 = default, an unset ``refine`` = server defaults) and rule params,
which travel as ``google.protobuf.Struct``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import types
import typing
from typing import Any, TypeVar

from google.protobuf import struct_pb2

from coinfer import types as t
from coinfer.chat import ChatMessage
from coinfer.errors import ResourceExhausted
from coinfer.extract import Extraction
from coinfer.rules import MAX_PARAMS_BYTES, Rule
from coinfer.v1 import coinfer_pb2 as pb

T = TypeVar("T")
log = logging.getLogger(__name__)

_EVENT_FIELD = {
    t.SessionAccepted: "accepted",
    t.Verdict: "verdict",
    t.AnswerChunk: "chunk",
    t.Summary: "summary",
    t.RetryAdvice: "retry",
    t.AnswerReset: "reset",
    t.DraftFrom: "draft_from",
}


def to_pb(obj: Any, msg_cls: type) -> Any:
    """Dataclass -> protobuf message of ``msg_cls`` (recursively)."""
    msg = msg_cls()
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None:
            continue
        if isinstance(obj, t.SamplingParams) and f.name == "seed":
            msg.seed = v
        elif isinstance(v, Extraction):
            getattr(msg, f.name).CopyFrom(extraction_to_pb(v))
        elif isinstance(v, dict):
            getattr(msg, f.name).update(jsonable(v))
        elif isinstance(v, tuple):
            getattr(msg, f.name).extend(v)
        elif isinstance(v, Rule) or (isinstance(v, list) and v and isinstance(v[0], Rule)):
            getattr(msg, f.name).extend(rule_to_pb(r) for r in v)
        elif dataclasses.is_dataclass(v):
            getattr(msg, f.name).CopyFrom(to_pb(v, type(getattr(msg, f.name))))
        elif isinstance(v, list) and v and dataclasses.is_dataclass(v[0]):
            sub = getattr(msg, f.name)
            for item in v:
                el = sub.add()
                el.CopyFrom(to_pb(item, type(el)))
        elif isinstance(v, list):
            getattr(msg, f.name).extend(v)
        elif isinstance(v, enum.StrEnum):
            setattr(msg, f.name, v.value)
        elif isinstance(v, enum.Enum):
            setattr(msg, f.name, int(v))
        else:
            setattr(msg, f.name, v)
    return msg


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s resolved field types, once per class: resolving them parses the annotations' strings
    (2% of the cloud server's busy time at 56 split answers/s, py-spy, before this cache)."""
    return typing.get_type_hints(cls)


def from_pb(msg: Any, cls: type[T]) -> T:
    """Protobuf message -> dataclass ``cls`` (recursively)."""
    hints = _hints(cls)
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        v = getattr(msg, f.name)
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        target = hint
        if cls is t.SamplingParams and f.name == "seed":
            kw[f.name] = v or None
        elif cls is t.SamplingParams and f.name in _ZERO_MEANS_DEFAULT:
            # proto3 cannot tell "unset" from 0: these fields promise 0 means the default
            kw[f.name] = (float(f"{v:.7g}") if isinstance(v, float) else v) or _ZERO_MEANS_DEFAULT[f.name]
        elif target is Extraction:
            kw[f.name] = extraction_from_pb(v)
        elif target is dict:
            kw[f.name] = _ints(struct_to_dict(v))
        elif typing.get_origin(target) is tuple:
            kw[f.name] = tuple(v)
        elif target is list or typing.get_origin(target) is list:
            (item,) = typing.get_args(target)
            if item is Rule:
                kw[f.name] = [rule_from_pb(r) for r in v]
            elif dataclasses.is_dataclass(item):
                kw[f.name] = [from_pb(x, item) for x in v]
            else:
                kw[f.name] = list(v)
        elif dataclasses.is_dataclass(target):
            kw[f.name] = from_pb(v, target) if msg.HasField(f.name) else None
        elif isinstance(target, type) and issubclass(target, enum.StrEnum):
            kw[f.name] = str_enum(target, v, f.default if f.default is not dataclasses.MISSING else None, f.name)
        elif isinstance(target, type) and issubclass(target, enum.Enum):
            kw[f.name] = target(v)
        elif isinstance(v, float):
            kw[f.name] = float(f"{v:.7g}")  # float32 on the wire: drop the binary noise (0.3 -> 0.30000001)
        else:
            kw[f.name] = v
    return cls(**kw)


def str_enum(cls: type[enum.StrEnum], value: str, default: Any, name: str) -> Any:
    """A closed set sent as a string (``Summary.refine_mode``): "" is ``default`` (proto3 cannot send
    "unset"), and so is a value this version does not know -- a newer peer's, logged -- since a report
    field must not fail an answer that is otherwise whole."""
    if value:
        try:
            return cls(value)
        except ValueError:
            log.warning("%s: unknown %s %r from the peer; taken as the default", name, cls.__name__, value)
    return default


_ZERO_MEANS_DEFAULT = {"top_p": 1.0, "max_new_tokens": t.SamplingParams.max_new_tokens}


def struct_to_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as Python values. Not json_format.MessageToDict: that raises ValueError on NaN and inf,
    which any peer can put in a Struct (the receiver's validation refuses them, naming the field)."""

    def value(v: struct_pb2.Value) -> Any:
        kind = v.WhichOneof("kind")
        if kind == "struct_value":
            return struct_to_dict(v.struct_value)
        if kind == "list_value":
            return [value(x) for x in v.list_value.values]
        return None if kind in (None, "null_value") else getattr(v, kind)

    return {k: value(v) for k, v in s.fields.items()}  # recursion: protobuf parses 100 messages deep at most


def _ints(v: Any) -> Any:
    """Struct numbers are doubles: give integral ones back as ints (72.0 -> 72)."""
    if isinstance(v, dict):
        return {k: _ints(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_ints(x) for x in v]
    return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**53 else v


def jsonable(v: Any) -> Any:
    """Struct values: numbers, strings, bools, lists and dicts only (a Fraction or tuple is converted)."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int) and abs(v) > 2**1023:  # past a double: its digits, not an OverflowError
        return str(v)
    return float(v) if isinstance(v, (int, float)) else str(v)


def extraction_to_pb(e: Extraction) -> pb.Extraction:
    kind = pb.ExtractionKind.Value(f"EXTRACTION_KIND_{e.kind.upper()}") if e.kind else 0
    return pb.Extraction(kind=kind, pattern=e.pattern, marker=e.marker)


def extraction_from_pb(e: pb.Extraction) -> Extraction:
    """An unknown enum number (a newer peer) reads as its number: validation names it."""
    try:
        name = pb.ExtractionKind.Name(e.kind)
    except ValueError:
        return Extraction(kind=f"#{e.kind}", pattern=e.pattern, marker=e.marker)
    kind = "" if e.kind == 0 else name.removeprefix("EXTRACTION_KIND_").lower()
    return Extraction(kind=kind, pattern=e.pattern, marker=e.marker)


def rule_to_pb(r: Rule) -> pb.Rule:
    params = struct_pb2.Struct()
    params.update(dict(r.params))
    return pb.Rule(kind=r.kind, params=params, name=r.name)


def rule_from_pb(r: pb.Rule) -> Rule:
    size = r.params.ByteSize()
    if size > MAX_PARAMS_BYTES:  # before the conversion, which costs per value
        raise ResourceExhausted(f"problem.rules.params: {size} bytes > limit {MAX_PARAMS_BYTES}")
    return Rule(r.kind, struct_to_dict(r.params), r.name)


def event_to_pb(ev: t.CloudEvent) -> pb.CloudMessage:
    name = _EVENT_FIELD[type(ev)]
    return pb.CloudMessage(**{name: to_pb(ev, type(getattr(pb.CloudMessage(), name)))})


def event_from_pb(msg: pb.CloudMessage) -> t.CloudEvent:
    name = msg.WhichOneof("kind")
    cls = next(c for c, n in _EVENT_FIELD.items() if n == name)
    return from_pb(getattr(msg, name), cls)


def open_from_pb(msg: pb.SessionOpen) -> t.OpenRequest:
    p = msg.problem
    return t.OpenRequest(
        request_id=msg.request_id,
        task=p.task,
        prompt=p.prompt,
        rules=[rule_from_pb(r) for r in p.rules],
        refine=from_pb(msg.refine, t.SamplingParams) if msg.HasField("refine") else None,
        expected_drafts=msg.expected_drafts,
        deadline_ms=msg.deadline_ms,
        messages=[ChatMessage(m.role, m.content) for m in p.messages],
        extraction=extraction_from_pb(p.extraction),
        draft_model=msg.draft_model,
        drafts_on_request=msg.drafts_on_request,
    )


def problem_to_pb(req: t.OpenRequest) -> pb.Problem:
    return pb.Problem(
        task=req.task,
        prompt=req.prompt,
        rules=[rule_to_pb(r) for r in req.rules],
        messages=[pb.ChatMessage(role=m.role, content=m.content) for m in req.messages],
        extraction=extraction_to_pb(req.extraction),
    )


def open_to_pb(req: t.OpenRequest) -> pb.SessionOpen:
    msg = pb.SessionOpen(
        request_id=req.request_id,
        expected_drafts=req.expected_drafts,
        deadline_ms=req.deadline_ms,
        problem=problem_to_pb(req),
        draft_model=req.draft_model,
        drafts_on_request=req.drafts_on_request,
    )
    if req.refine is not None:
        msg.refine.CopyFrom(to_pb(req.refine, pb.SamplingParams))
    return msg
