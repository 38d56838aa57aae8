"""What the campaign sends: hypothesis strategies for hostile values, for the prompts, drafts, regexes, schemas
and rules the parsers see, for any protobuf message (built from the descriptors), for hand-written and mutated
wire bytes, and for HTTP bodies and headers; ``GrpcCall`` and ``HttpCall`` are the generated calls."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

from coinfer.extract import json_shape
from coinfer.rules import RULE_KINDS
from coinfer.v1 import coinfer_pb2 as pb
from coinfer.v1 import edge_pb2 as epb

FD = FieldDescriptor
MODEL = "coinfer-edge"
CHEAP_TOKENS = (1, 8)
CHEAP_DEADLINE_MS = (50, 2000)
"""Where a valid token budget or deadline is mapped: a request that passes validation costs a few
engine steps, not a full generation (the CPU engine would spend the campaign writing text)."""


# ---- hostile values ---------------------------------------------------------------------------------

def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """``one_of`` with integer weights (hypothesis' own is uniform over its branches)."""
    pool = [s for w, s in choices for _ in range(w)]
    # sampled_from a range is uniform (integers() favour 0) and keeps the repr small (hypothesis renders
    # strategies' reprs: over copies of nested choices they grow exponentially)
    return st.sampled_from(range(len(pool))).flatmap(lambda i: pool[i])


def repeat(unit: str, n: int) -> str:
    return unit * n


SPECIAL_TEXT = (
    "", " ", "\x00", "\n\n\n", "\t", "\r\n", "\u202e", "\ufeff", "\u200b", "\U0001f642", "A\u0301", "\ufdfa",
    "\u0130", "\uffff", "\U0010ffff", "NaN", "-0", "null", "true", "%s%s%n", "{}", "[]", "{{x}}", "${x}",
    "../../../etc/passwd", "C:\\Windows\\win.ini", "<script>", "' OR 1=1 --", "Answer:", "answer 5", "\\boxed{",
    "}", "If x=1 and y=2, compute x+y.", "Pick 2 of A(1,2) B(3,4) with cost<=5.", "system", "user", "assistant",
)
BIG_SIZES = (1000, 4097, 8193, 100_000, 1 << 20, (4 << 20) + 1)
"""Up to one byte over the cloud's message limit (4 MiB): the limits must answer, not the parsers."""
SIZES = weighted((9, st.sampled_from(BIG_SIZES[:3])), (1, st.sampled_from(BIG_SIZES[3:])))
"""Mostly past the prompt and draft limits, sometimes past the message limit (which costs to send)."""
BIG_UNITS = ("a", " ", "9", "(", "{", "[", "\x00", "\u00e9", "\U0001f642", "ab", "1+")


@functools.cache  # strategies are built once: building them per draw dominated generation
def text(max_size: int = 32, big: bool = True, surrogates: bool = False) -> st.SearchStrategy[str]:
    """Hostile strings: any unicode, control / format / combining characters, known troublemakers,
    and (``big``) runs up to past the message limit. ``surrogates``: lone UTF-16 surrogates too (only
    JSON can carry them: protobuf strings are UTF-8)."""
    cats = ["Cc", "Cf", "Co", "Mn", "Zl", "Zp", "Zs"] + (["Cs"] if surrogates else [])
    choices = [(12, st.text(max_size=max_size)), (6, st.text(st.characters(categories=cats), max_size=max_size)),
               (9, st.sampled_from(SPECIAL_TEXT))]
    if surrogates:
        choices.append((3, st.text(st.characters(categories=["Cs", "Ll"]), min_size=1, max_size=4)))
    if big:
        choices.append((1, st.builds(repeat, st.sampled_from(BIG_UNITS), SIZES)))
    return weighted(*choices)


@functools.cache
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """The range's edges and the usual overflow points inside it, or any value in it."""
    edges = (lo, hi, 0, 1, -1, 2, 7, 8, 16, 17, 64, 65, 255, 256, 1000, 4096, 2**15, 2**16, 16 << 20, (16 << 20) + 1,
             600_000, 600_001, 2**31 - 1, 2**31, 2**32 - 1, 2**53 + 1, 2**63 - 1)
    return st.one_of(st.sampled_from(sorted({v for v in edges if lo <= v <= hi})), st.integers(lo, hi))


@functools.cache
def floats(width: int = 64) -> st.SearchStrategy[float]:
    edges = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1.0, 0.5, 1.0, 1.0000001, 2.0, 2.0000002, 3.4e38,
             -3.4e38) + ((1e308, -1e308, 5e-324) if width == 64 else ())
    return st.one_of(st.sampled_from(edges), st.floats(width=width))


INT_RANGES = {
    FD.TYPE_INT32: (-2**31, 2**31 - 1), FD.TYPE_SINT32: (-2**31, 2**31 - 1), FD.TYPE_SFIXED32: (-2**31, 2**31 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1), FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_INT64: (-2**63, 2**63 - 1), FD.TYPE_SINT64: (-2**63, 2**63 - 1), FD.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1), FD.TYPE_FIXED64: (0, 2**64 - 1),
}


@functools.cache
def json_values(max_leaves: int = 12, surrogates: bool = False) -> st.SearchStrategy:
    """Any JSON shape: numbers at their extremes (NaN and inf too: Python's json reads them), hostile strings."""
    leaf = st.one_of(st.none(), st.booleans(), ints(-2**64, 2**64), floats(), text(16, big=False, surrogates=surrogates))
    return st.recursive(leaf, lambda kids: st.lists(kids, max_size=4)
                        | st.dictionaries(text(8, big=False, surrogates=surrogates), kids, max_size=4),
                        max_leaves=max_leaves)


def nest(depth: int, inner: Any = 1, key: str | None = "a") -> Any:
    """``depth`` levels of objects (``key``) or arrays (None) around ``inner``, built without recursion."""
    for _ in range(depth):
        inner = {key: inner} if key is not None else [inner]
    return inner


DEPTHS = (20, 40, 100, 500, 3000)

# ---- what the parsers and rules see ------------------------------------------------------------------

ARITH = "If x=1 and y=2, compute"
PROMPTS = st.one_of(
    st.sampled_from(("If x=3 and y=5, compute (x+y)^2-x*y.", "If x=2 and y=7, compute x*y+x+y.",
                     "Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8.", "What is 2 plus 3?",
                     "If x=9 and y=9, compute x^9^9^9.", f"{ARITH} x**y.", f"{ARITH} z.", f"{ARITH} x/y.",
                     f"{ARITH} __import__('os').system('id').", f"{ARITH} 9^9^9.", "If x=999999 and y=2, compute x^8.",
                     "Pick 0 of A(1,2) with cost<=5.", "Pick 2 of A(1,2) A(3,4) with cost<=5.",
                     "Pick 13 of " + " ".join(f"{chr(65 + i)}(1,1)" for i in range(26)) + " with cost<=99.")),
    st.builds(lambda n: ARITH + " " * n + "!", st.sampled_from((10, 1000, 2000, 2047, 8192, 100_000))),
    st.builds(lambda n: f"{ARITH} " + "+".join(["x"] * n) + ".", st.sampled_from((64, 65, 1000, 5000))),
    st.builds(lambda n: f"{ARITH} " + "-" * n + "x.", st.sampled_from((64, 65, 1000, 5000))),
    st.builds(lambda n: f"{ARITH} " + "(" * n + "x" + ")" * n + ".", st.sampled_from((64, 65, 300, 1000))),
    st.builds(lambda n: "If x=" + "9" * n + " and y=2, compute x*y.", st.sampled_from((13, 20, 4300, 4301, 5000))),
    st.builds(lambda n: f"{ARITH} " + "9" * n + "+x.", st.sampled_from((20, 4301, 5000))),
    st.builds(lambda n: "Pick 2 of " + "A(1,2) " * n + "with cost<=" + " " * n + "!", st.sampled_from((250, 2000))),
    st.builds(lambda d: f"Pick {d} of A(1,2) B(3,4) with cost<=5.", st.sampled_from(("1", "9" * 20, "9" * 5000))),
    st.builds(lambda d: f"Pick 1 of A({d},2) B(3,4) with cost<={d}.", st.sampled_from(("9" * 20, "9" * 5000))),
    text(64),
)
DRAFTS = st.one_of(
    st.sampled_from(("3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49", "answer 5", "AB 7:7; AC 5:11; answer A,C",
                     '{"ids": ["A", "B"]}', "Answer: 42", "\\boxed{42}", "48 / 2 = 24; 24 / 0 = 1", "2 x 3 x 4 = 24",
                     '{"answer": NaN, "b": Infinity, "c": -1e999}', "", " ")),
    st.builds(lambda n: "a" * n + "!", st.sampled_from((30, 60, 1000, 4000, 4097))),
    st.builds(lambda u, n: u * n, st.sampled_from(("[", "{", "(", "{\"a\":", "\\boxed{", "Answer:", "=", "-", "1,000,")),
              st.sampled_from((100, 1000, 2000, 4096))),
    st.builds(lambda n: '{"a": ' + "[" * n + "]" * n + "}", st.sampled_from((50, 900, 2000))),
    st.builds(lambda n: "x {\"ids\": " + "[" * n + "]" * n + "}", st.sampled_from((50, 900, 2000))),
    st.builds(lambda n: "answer " + "9" * n, st.sampled_from((20, 4300, 4301, 5000))),
    st.builds(lambda n: "1+1=" + "9" * n + "; answer 2", st.sampled_from((20, 4301))),
    st.builds(lambda n: "AB " + "9" * n + ":3; answer A", st.sampled_from((20, 4301))),
    st.builds(lambda n: "Answer: " + "9" * n + ".5", st.sampled_from((20, 400, 4301))),
    st.builds(lambda n: "+".join(["1"] * n) + f"={n}; answer {n}", st.sampled_from((64, 65, 1000, 2000))),
    st.builds(lambda n: "-" * n + "1=1; answer 1", st.sampled_from((64, 1000, 4000))),
    st.builds(lambda n: '{"answer": "' + "a" * n + '!"}', st.sampled_from((20, 26, 30, 1000))),
    st.builds(lambda n: "{" + ",".join(f'"k{i}": {i}' for i in range(n)) + "}", st.sampled_from((100, 400))),
    st.builds(lambda n: '{"answer": [' + ",".join(f'{{"a": {i}}}' for i in range(n)) + "]}", st.sampled_from((300, 500))),
    text(64),
)
REGEXES = st.one_of(
    st.sampled_from(("(a+)+$", "(a|aa)+$", "(a|a)*b", "(.*a){20}", "((a*)*)*b", "^(\\d+)*$", "(?P<answer>(a|aa)+)$",
                     "(?P<answer>(a+)+)$", "(?P<answer>\\d+)", "(?P<answer>.*)", "(?P<answer>(?R)?a)", "(?:abc){e<=3}",
                     "\\", "(", "[", "(?P<answer>", "(?<=a+)b", "(?P<a>x)(?P=a)", "\\p{L}+", "(?V1)((a|b)*)*c",
                     "a{1000000}", "(?:(?:a{100}){100}){100}", "(?i)(?P<answer>x{0,65535}){0,65535}", "x" * 513,
                     "(?P<answer>" + "(a)" * 100 + ")", "(?P<" + "n" * 300 + ">a)")),
    text(48, big=False),
)
_DEFS = {f"d{i}": {"anyOf": [{"$ref": f"#/definitions/d{i + 1}"}, {"$ref": f"#/definitions/d{i + 1}"}]} for i in range(30)}
SCHEMAS = st.one_of(
    st.sampled_from((
        {"$ref": "#"}, {"allOf": [{"$ref": "#"}]}, {"$ref": "http://example.invalid/schema.json"},
        {"$ref": "file:///etc/passwd"}, {"$ref": "#/definitions/nope"}, {"definitions": _DEFS | {"d30": {"type": "integer"}},
                                                                        "$ref": "#/definitions/d0"},
        {"properties": {"answer": {"type": "string", "pattern": "^(a+)+$"}}},
        {"patternProperties": {"^(a+)+$": {"type": "string"}}, "additionalProperties": False},
        {"additionalProperties": False, "patternProperties": {"(x+x+)+y": {}}},
        {"properties": {"answer": {"uniqueItems": True}}}, {"type": "nonsense"}, {"minLength": 1e308},
        {"multipleOf": 1e-308}, {"multipleOf": 0}, {"format": "regex"}, {"enum": list(range(10_000))},
        {"$schema": "http://json-schema.org/draft-03/schema#", "properties": {"a": {"required": True}}},
        {"$schema": "https://evil.invalid/schema"}, {"if": {"required": ["a"]}, "then": {"$ref": "#"}},
        {"properties": {"answer": {"maximum": math.nan}}}, {"type": "object", "required": ["answer"] * 1000},
    )),
    st.builds(nest, st.sampled_from(DEPTHS), st.just({}), st.sampled_from(("not", "items", "allOf"))),
    json_values(16).map(lambda v: v if isinstance(v, dict) else {"const": v}),
)
SHALLOW_SCHEMAS = SCHEMAS.filter(lambda sc: json_shape(sc)[0] <= 200)
"""Schemas json.dumps can write (it recurses per level): deeper ones are written by hand (RAW_BODIES)."""
_NUMS = st.one_of(ints(-2**64, 2**64), floats(), st.sampled_from((None, True, "5", [], {})))


@functools.cache
def rule_params(kind: str) -> st.SearchStrategy[dict]:
    """Params a rule of ``kind`` reads, with hostile values, plus stray keys."""
    fields_ = st.sampled_from(("answer", "ids", "answer_text", "", "missing")) | text(16, big=False)
    by_kind = {
        "numeric_bounds": {"field": fields_, "min": _NUMS, "max": _NUMS},
        "membership": {"field": fields_, "values": st.one_of(st.lists(json_values(2), max_size=4), _NUMS, text(8),
                                                              st.builds(lambda n: list(range(n)), st.sampled_from((1000, 100_000))))},
        "count": {"field": fields_, "min": _NUMS, "max": _NUMS, "unique": json_values(2)},
        "length": {"min": _NUMS, "max": _NUMS},
        "regex": {"pattern": REGEXES, "must_match": json_values(2)},
        "task_check": {"check": st.sampled_from(("arith_steps", "select_steps", "select_budget", "")) | text(8)},
        "json_schema": {"schema": SHALLOW_SCHEMAS},
    }.get(kind, {})
    return st.fixed_dictionaries({}, optional=by_kind | {"extra": json_values(4)})


def struct_of(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


RULE_KIND = weighted((6, st.sampled_from(RULE_KINDS)), (1, st.sampled_from(("", "regexp", "JSON_SCHEMA"))),
                     (1, text(16, big=False)))
RULES_JSON = RULE_KIND.flatmap(lambda k: st.fixed_dictionaries(
    {"kind": st.just(k)}, optional={"params": rule_params(k), "name": text(16)}))
"""Rules as the HTTP API takes them ({"kind", "params", "name"})."""


def make_rule(kind: str, params: dict | None = None, name: str = "") -> pb.Rule:
    r = pb.Rule(kind=kind, name=name)
    r.params.update(params or {})  # in place: a constructor's copy would refuse what the server must refuse
    return r


def pb_rule() -> st.SearchStrategy[pb.Rule]:
    params = RULES_JSON.map(lambda r: r.get("params", {}))
    return st.builds(make_rule, RULE_KIND, params.filter(_fits_struct), text(16, big=False))


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
    return st.one_of(st.builds(lambda d: wrap({"schema": nest(d, {}, "not")}), depth),
                     st.builds(lambda d: wrap({"field": "answer", "values": nest(d, 1, None)}), depth))


def _fits_struct(value: Any) -> bool:
    """Whether the client library can build (and copy) a Struct of ``value``: its numbers are doubles, and a
    copy parses at most 100 messages deep, three a level (deeper params go by ``deep_rule``)."""
    if json_shape(value)[0] > 25:
        return False
    try:
        struct_of(value if isinstance(value, dict) else {})
    except (OverflowError, ValueError, TypeError):
        return False
    return True


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """A field of a near-valid request: valid (6 in 7), else hostile. With every field hostile at
    once nothing would pass validation, and the parsers, rules and engines behind it would go untested."""
    return weighted((6, valid), (1, hostile))


EXTRACTIONS = st.builds(pb.Extraction, kind=st.one_of(st.sampled_from(range(7)), ints(-2**31, 2**31 - 1)),
                        pattern=REGEXES, marker=text(16) | st.sampled_from(("Answer:", "=", "\\boxed{", "x" * 65)))
ROLES = st.sampled_from(("system", "user", "assistant", "", "tool", "USER")) | text(8)
CHAT = st.builds(pb.ChatMessage, role=ROLES, content=PROMPTS)
SMALL_CHAT = st.builds(pb.ChatMessage, role=ROLES, content=text(16, big=False))
"""The element of a conversation of a thousand turns (of big ones, the example would take gigabytes)."""
VALID_PROBLEMS = st.sampled_from((
    ("arith", "If x=3 and y=5, compute (x+y)^2-x*y."), ("arith", "If x=2 and y=7, compute x*y+x+y."),
    ("select", "Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8."), ("", "If x=4 and y=1, compute x^2-y."),
    ("", "Tom has 3 apples and buys 4 more. How many apples does he have?"), ("", "Say hello.")))
RUNTIME_RULES = st.one_of(  # valid rules that run a client's program on every draft
    st.builds(lambda p, m: make_rule("regex", {"pattern": p, "must_match": m}), REGEXES, st.booleans()),
    SCHEMAS.filter(lambda sc: _fits_struct({"schema": sc})).map(lambda sc: make_rule("json_schema", {"schema": sc})),
    st.sampled_from((make_rule("arithmetic"), make_rule("length", {"max": 512}),
                     make_rule("numeric_bounds", {"field": "answer", "min": -1e9, "max": 1e9}),
                     make_rule("task_check", {"check": "arith_steps"}))),
)
VALID_EXTRACTIONS = st.one_of(
    st.builds(pb.Extraction, kind=st.sampled_from(range(7)), marker=st.sampled_from(("", "Answer:", "answer"))),
    st.builds(lambda p, named: pb.Extraction(kind=pb.EXTRACTION_KIND_REGEX, pattern=f"(?P<answer>{p})" if named else p),
              REGEXES, st.booleans()))


def sampling() -> st.SearchStrategy[pb.SamplingParams]:
    return st.builds(pb.SamplingParams,
                     temperature=mostly(st.floats(0, 2, width=32), floats(32)),
                     top_p=mostly(st.floats(0, 1, width=32), floats(32)),
                     presence_penalty=mostly(st.floats(-2, 2, width=32), floats(32)),
                     frequency_penalty=mostly(st.floats(-2, 2, width=32), floats(32)),
                     max_new_tokens=mostly(st.integers(*CHEAP_TOKENS), ints(0, 2**32 - 1)),
                     seed=mostly(st.integers(0, 1000), ints(0, 2**64 - 1)),
                     stop=mostly(st.lists(st.sampled_from(("\n", ";", "answer", "Answer:")), max_size=2),
                                 st.lists(text(70, big=False), max_size=9)))


def problem() -> st.SearchStrategy[pb.Problem]:
    """A problem whose task and prompt agree (or not), with rules, extraction and a conversation that
    are mostly valid: a hostile regex or schema then runs on real drafts."""
    def build(base: tuple[str, str], task: str | None, prompt: str | None, rules: list, chat: list | None,
              extraction: pb.Extraction | None) -> pb.Problem:
        p = pb.Problem(task=base[0] if task is None else task, rules=rules)
        if chat is None:
            p.prompt = base[1] if prompt is None else prompt
        else:
            p.messages.extend(chat + [pb.ChatMessage(role="user", content=base[1] if prompt is None else prompt)])
        if extraction is not None:
            p.extraction.CopyFrom(extraction)
        return p

    many = st.builds(lambda m, n: [m] * n, SMALL_CHAT, st.sampled_from((65, 1000)))
    rules = weighted((4, st.just([])), (3, st.lists(RUNTIME_RULES, min_size=1, max_size=2)),
                     (1, st.lists(pb_rule(), max_size=3)))
    chat = weighted((5, st.none()), (1, st.just([pb.ChatMessage(role="system", content="Be brief.")])),
                    (1, weighted((9, st.lists(CHAT, max_size=3)), (1, many))))
    return st.builds(build, VALID_PROBLEMS,
                     mostly(st.none(), st.sampled_from(("", "arith", "select", "ARITH", "arith ", "poetry")) | text(8)),
                     mostly(st.none(), PROMPTS), rules, chat,
                     weighted((4, st.none()), (2, VALID_EXTRACTIONS), (1, EXTRACTIONS)))


def cheap_tokens(n: int, small: int) -> int:
    """A valid token budget (0 = the server's default, hundreds) becomes ``small``; an invalid one stays."""
    return small if n <= 4096 else n


def cheap_deadline(ms: int, small: int) -> int:
    return small if ms <= 600_000 else ms


def cheapen(msg: Message, small_tokens: int, small_ms: int) -> Message:
    """Map the costly knobs of a request (SessionOpen, GenerateRequest, SolveRequest; an EdgeMessage's
    open) into cheap values."""
    if msg.DESCRIPTOR.name == "EdgeMessage":
        if msg.HasField("open"):
            cheapen(msg.open, small_tokens, small_ms)
        return msg
    sp = next((f for f in ("refine", "sampling") if f in msg.DESCRIPTOR.fields_by_name), None)
    if sp is not None:
        getattr(msg, sp).max_new_tokens = cheap_tokens(getattr(msg, sp).max_new_tokens, small_tokens)
    msg.deadline_ms = cheap_deadline(msg.deadline_ms, small_ms)
    return msg


def cheap(strategy: st.SearchStrategy[Message]) -> st.SearchStrategy[Message]:
    return st.builds(cheapen, strategy, st.integers(*CHEAP_TOKENS), st.integers(*CHEAP_DEADLINE_MS))


REQUEST_IDS = mostly(st.just("") | st.text("abcdef0123456789-", max_size=16), text(16))


def session_open() -> st.SearchStrategy[pb.SessionOpen]:
    return cheap(st.builds(pb.SessionOpen, request_id=REQUEST_IDS, problem=problem(), refine=sampling(),
                           expected_drafts=mostly(st.integers(0, 8), ints(0, 2**32 - 1)),
                           deadline_ms=mostly(st.integers(*CHEAP_DEADLINE_MS), ints(0, 2**32 - 1))))


def draft() -> st.SearchStrategy[pb.Draft]:
    return st.builds(pb.Draft, index=ints(0, 2**32 - 1), text=DRAFTS, num_tokens=mostly(st.integers(0, 300), ints(0, 2**32 - 1)),
                     mean_logprob=mostly(st.floats(-5, 0, width=32), floats(32)), edge_ms=floats(32))


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
        return st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), ints(-2**31, 2**31 - 1))
    if f.type == FD.TYPE_BYTES:
        return weighted((9, st.binary(max_size=64)), (1 if big else 0, st.builds(bytes, SIZES)))
    return text(32, big=big)


def _field(f: FieldDescriptor, big: bool = True) -> st.SearchStrategy:
    mt = f.message_type
    if mt is not None and mt.GetOptions().map_entry:
        return st.dictionaries(_scalar(mt.fields_by_name["key"], False), _scalar(mt.fields_by_name["value"], False),
                               max_size=4)
    one = message(mt, big) if mt is not None else _scalar(f, big)
    if not f.is_repeated:
        return one
    small = message(mt, False) if mt is not None else _scalar(f, False)
    # many entries of a small element: thousands of rules, stop strings, messages
    return weighted((9, st.lists(one, max_size=4)),
                    (1, st.builds(lambda x, n: [x] * n, small, st.sampled_from((9, 65, 1000, 10_000)))))


@functools.cache
def message(desc: Descriptor, big: bool = True) -> st.SearchStrategy[Message]:
    """Any message of type ``desc``: each field unset or any value of its type (Struct: any JSON object)."""
    if desc.full_name == "google.protobuf.Struct":
        return st.dictionaries(text(8, big=False), json_values(6), max_size=4).filter(_fits_struct).map(struct_of)
    cls = message_factory.GetMessageClass(desc)
    return st.fixed_dictionaries({}, optional={f.name: _field(f, big) for f in desc.fields}).map(
        lambda kw: _build(cls, kw))


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


BAD_UTF8 = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xc0\x80", b"\xe0\x80\xaf",
            b"\xfe\xff", b"a\x80b")
"""Invalid UTF-8: a stray byte, a cut sequence, UTF-16 surrogates (CESU-8), past U+10FFFF, overlong forms."""


def _wire_field(f: FieldDescriptor, depth: int) -> st.SearchStrategy[bytes]:
    n = f.number
    if f.type in (FD.TYPE_STRING, FD.TYPE_BYTES):
        good = text(16, big=False).map(str.encode)
        bad = st.tuples(st.text(max_size=4), st.sampled_from(BAD_UTF8), st.text(max_size=4)).map(
            lambda p: p[0].encode() + p[1] + p[2].encode())
        return st.one_of(good, bad).map(lambda b: delimited(n, b))
    if f.type in (FD.TYPE_MESSAGE, FD.TYPE_GROUP):
        inner = wire(f.message_type, depth + 1) if depth < 4 else st.binary(max_size=8)
        return inner.map(lambda b: delimited(n, b))
    if f.type in (FD.TYPE_FLOAT, FD.TYPE_FIXED32, FD.TYPE_SFIXED32):
        return st.binary(min_size=4, max_size=4).map(lambda b: tag(n, 5) + b)
    if f.type in (FD.TYPE_DOUBLE, FD.TYPE_FIXED64, FD.TYPE_SFIXED64):
        return st.binary(min_size=8, max_size=8).map(lambda b: tag(n, 1) + b)
    any_int = ints(-2**63, 2**64 - 1)  # whatever the declared width: the parser truncates
    packed = st.lists(any_int, max_size=8).map(lambda xs: delimited(n, b"".join(varint(x) for x in xs)))
    return st.one_of(any_int.map(lambda x: tag(n, 0) + varint(x)), packed)


HOSTILE_WIRE = st.one_of(
    st.builds(lambda n, wt: tag(n, wt), st.integers(1, 2**29 - 1), st.integers(0, 7)),  # a tag, no value
    st.builds(lambda n, b: delimited(n, b), st.integers(1, 2**29 - 1), st.binary(max_size=16)),  # unknown field
    st.sampled_from((b"\x00", b"\x08" + b"\xff" * 11, b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05ab", b"\x0b", b"\x0c",
                     tag(19000, 0) + b"\x01", tag(0, 2) + b"\x00")),  # field 0, overlong varint, a length past the end, groups
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
        return b[:k % max(1, len(b))]

    def flip(b: bytes, k: int, x: int) -> bytes:
        if not b:
            return bytes([x])
        i = k % len(b)
        return b[:i] + bytes([b[i] ^ x]) + b[i + 1:]

    k, x = st.integers(0, 2**16), st.integers(1, 255)
    return st.one_of(st.builds(cut, serialised, k), st.builds(flip, serialised, k, x),
                     st.builds(bytes.__add__, serialised, st.binary(min_size=1, max_size=8)))


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
    foreign = st.sampled_from(ALL_MESSAGES).flatmap(lambda d: message(d, big=False)).map(lambda m: m.SerializeToString())
    return weighted((12 if semantic is not None else 0, good), (3, typed), (3, wire(desc)), (2, mutated(good)),
                    (1, foreign), (1, st.binary(max_size=64)))


# ---- requests -------------------------------------------------------------------------------------------

_KEY = st.from_regex(r"[a-z][a-z0-9_.-]{0,15}", fullmatch=True).filter(
    lambda k: not k.startswith("grpc") and not k.endswith("-bin") and k not in ("te", "content-type", "user-agent"))
METADATA = weighted((4, st.lists(st.tuples(_KEY, st.from_regex(r"[ -~]{0,40}", fullmatch=True).map(str.strip)),
                                 max_size=3)),
                    (1, st.builds(lambda n: [("authorization", "Bearer " + "x" * n)], st.just(20_000))))
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
        ds = [msg("draft", pb.Draft(index=i, text=d.text, num_tokens=d.num_tokens, mean_logprob=d.mean_logprob))
              for i, d in enumerate(drafts)]
        return [o, *ds, msg("done", pb.DraftsDone(count=len(ds) if count is None else count))]

    one = st.one_of(opened, drafted, done)
    return weighted(
        (8, st.builds(usual, opened, st.lists(draft(), max_size=5), mostly(st.none(), ints(0, 2**32 - 1)))),
        (2, st.lists(one, max_size=6)),
        (1, st.builds(lambda o, t, n: [o] + [msg("draft", pb.Draft(index=i, text=t)) for i in range(n)],
                      opened, text(16, big=False), st.sampled_from((17, 100, 1000)))),
    )


def http_text(max_size: int = 64) -> st.SearchStrategy[str]:
    return text(max_size, surrogates=True)


def rules_json() -> st.SearchStrategy[list]:
    """Rules as the HTTP API takes them: mostly valid ones that run a client's regex or schema on the drafts."""
    runtime = st.one_of(st.builds(lambda p: {"kind": "regex", "params": {"pattern": p}}, REGEXES),
                        st.builds(lambda sc: {"kind": "json_schema", "params": {"schema": sc}}, SHALLOW_SCHEMAS),
                        st.sampled_from(({"kind": "arithmetic"}, {"kind": "length", "params": {"max": 512}})))
    small = st.builds(lambda p: {"kind": "regex", "params": {"pattern": p}}, text(8, big=False))
    return weighted((3, st.lists(runtime, min_size=1, max_size=2)), (1, st.lists(RULES_JSON, max_size=3)),
                    (1, st.builds(lambda r, n: [r] * n, small, st.sampled_from((65, 1000)))))


def coinfer_extra() -> st.SearchStrategy:
    extraction = mostly(st.one_of(st.sampled_from(("none", "marker", "boxed", "last_line", "json")),
                                  st.builds(lambda p: {"kind": "regex", "pattern": p}, REGEXES)),
                        st.one_of(st.sampled_from(("regex", "", "MARKER")), json_values(4),
                                  st.fixed_dictionaries({"kind": st.sampled_from(("regex", "marker", "json", "x"))},
                                                        optional={"pattern": REGEXES, "marker": http_text(16),
                                                                  "x": json_values(2)})))
    extra = st.fixed_dictionaries({}, optional={
        "task": mostly(st.sampled_from(("", "arith", "select")), st.just("poetry") | json_values(2)),
        "extraction": extraction, "rules": mostly(rules_json(), json_values(4)),
        "plan": mostly(st.sampled_from(("auto", "edge", "split", "cloud")), st.just("moon") | json_values(2)),
        "num_drafts": mostly(st.integers(0, 8), _NUMS), "deadline_ms": mostly(st.integers(*CHEAP_DEADLINE_MS), _NUMS),
        "unknown": json_values(2)})
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
    message_ = st.fixed_dictionaries({"role": mostly(st.just("user"), st.sampled_from(("system", "assistant", "developer",
                                                                                        "tool")) | json_values(2)),
                                      "content": prompt}, optional={"name": json_values(2)})
    content = ({"messages": mostly(st.lists(message_, min_size=1, max_size=3), json_values(4))} if chat
               else {"prompt": prompt})

    def num(lo: float, hi: float) -> st.SearchStrategy:
        return mostly(st.floats(lo, hi), _NUMS)

    optional = {"max_tokens": mostly(st.integers(*CHEAP_TOKENS), _NUMS), "temperature": num(0, 2), "top_p": num(0.01, 1),
                "presence_penalty": num(-2, 2), "frequency_penalty": num(-2, 2),
                "seed": mostly(st.integers(0, 1000), _NUMS),
                "stop": mostly(st.sampled_from((";", ["\n", "answer"])), st.lists(http_text(70), max_size=9) | json_values(2)),
                "n": mostly(st.just(1), _NUMS), "coinfer": coinfer_extra(), "logprobs": json_values(2),
                "extra_field": json_values(4)}
    model = weighted((8, st.just(MODEL)), (1, http_text(16)), (1, json_values(2)))
    body = st.fixed_dictionaries({"model": model} | content, optional=optional).map(lambda b: b | {"stream": stream})
    shaped = weighted((8, body), (1, body.map(lambda b: {k: v for k, v in b.items() if k != "model"})),
                      (1, json_values(8, surrogates=True)))
    return st.builds(_cheap_body, shaped, st.integers(*CHEAP_TOKENS), st.integers(*CHEAP_DEADLINE_MS))


def _dumps(body: Any) -> bytes:
    return json.dumps(body).encode()  # NaN / Infinity as Python writes them; lone surrogates as \\udXXX escapes


RAW_BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from((b"", b"{", b"{not json", b"null", b"[]", b"\xff\xfe{\x00}\x00", b"\xef\xbb\xbf{}", b'{"model": "\xff"}',
                     b'{"model": "coinfer-edge", "prompt": "\xed\xa0\x80"}', b'{"model": "coinfer-edge", "prompt": "\\ud800"}',
                     b'{"model": "coinfer-edge", "messages": [{"role": "user", "content": "\\udfff\\ud800"}]}',
                     b'{"model": "coinfer-edge", "prompt": "hi", "max_tokens": 1e999}', b'{"a": 1, "a": 2}',
                     b'{"model": "coinfer-edge", "prompt": "x", "coinfer": {"rules": [{"kind": "regex", "params": '
                     b'{"pattern": "(a+)+$"}}]}}')),
    st.builds(lambda n: b"1" * n, st.sampled_from((4300, 4301, 5000))),
    st.builds(lambda n: b'{"model": "coinfer-edge", "prompt": "x", "max_tokens": ' + b"9" * n + b"}", st.sampled_from((4301, 10_000))),
    st.builds(lambda u, n: u * n, st.sampled_from((b"[", b"{\"a\":", b"[" * 1)), st.sampled_from((1000, 100_000, 1 << 20))),
    st.builds(lambda n: b"[" * n + b"]" * n, st.sampled_from((500, 1000, 5000, 100_000))),
    st.builds(lambda n: b'{"model": "coinfer-edge", "prompt": "x", "coinfer": {"rules": [{"kind": "json_schema", "params": '
              b'{"schema": ' + b'{"not": ' * n + b"{}" + b"}" * n + b"}}]}}", st.sampled_from((30, 500, 900, 3000))),
    st.builds(lambda n: b'{"model": "coinfer-edge", "prompt": "' + b"a" * n + b'"}', st.sampled_from(((1 << 20) + 1,))),
)


def http_posts(path: str, chat: bool, stream: bool) -> st.SearchStrategy[HttpCall]:
    body = weighted((8, openai_body(chat, stream).map(_dumps)), (2, RAW_BODIES))
    odd = st.sampled_from(((("content-type", "text/plain"),), (("content-type", "application/json; charset=utf-16"),),
                           (("content-encoding", "gzip"),)))
    big = st.builds(lambda n: (("x-junk", "y" * n),), st.just(20_000))  # built: a literal would bloat reprs
    headers = weighted((16, st.just(())), (1, odd), (1, big))
    return st.builds(lambda b, h: HttpCall("POST", path, b, h), body, headers)


def http_gets(path: str) -> st.SearchStrategy[HttpCall]:
    key = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True).filter(
        lambda k: k.lower() not in ("host", "content-length", "transfer-encoding", "connection"))
    value = st.from_regex(r"[ -~]{0,64}", fullmatch=True).map(str.strip)  # edge spaces: the client refuses them
    headers = weighted((9, st.lists(st.tuples(key, value), max_size=3)),
                       (1, st.builds(lambda n: [("x-junk", "y" * n)], st.just(70_000))))
    params = st.lists(st.tuples(text(8, big=False), text(16, big=False)), max_size=3)
    method = weighted((8, st.just("GET")), (1, st.sampled_from(("HEAD", "POST", "DELETE", "OPTIONS"))))
    return st.builds(lambda m, h, p, b: HttpCall(m, path, b, tuple(h), tuple(p)), method, headers, params,
                     st.none() | st.binary(max_size=32))
