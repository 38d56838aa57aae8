"""What the parsers and rules see: prompts, drafts, regexes, JSON schemas, rules of every kind, chats,
problems, sampling; requests cheapened so that a valid one costs a few engine steps."""

from __future__ import annotations

import functools
import math
from typing import Any

from google.protobuf import struct_pb2
from google.protobuf.message import Message
from hypothesis import strategies as st

from coinfer.extract import json_shape
from coinfer.rules import RULE_KINDS
from coinfer.v1 import coinfer_pb2 as pb
from scenarios.hostile.strategies.values import (
    CHEAP_DEADLINE_MS,
    CHEAP_TOKENS,
    DEPTHS,
    floats,
    ints,
    json_values,
    nest,
    text,
    weighted,
)

# ---- what the parsers and rules see ------------------------------------------------------------------

ARITH = "If x=1 and y=2, compute"
PROMPTS = st.one_of(
    st.sampled_from(
        (
            "If x=3 and y=5, compute (x+y)^2-x*y.",
            "If x=2 and y=7, compute x*y+x+y.",
            "Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8.",
            "What is 2 plus 3?",
            "If x=9 and y=9, compute x^9^9^9.",
            f"{ARITH} x**y.",
            f"{ARITH} z.",
            f"{ARITH} x/y.",
            f"{ARITH} __import__('os').system('id').",
            f"{ARITH} 9^9^9.",
            "If x=999999 and y=2, compute x^8.",
            "Pick 0 of A(1,2) with cost<=5.",
            "Pick 2 of A(1,2) A(3,4) with cost<=5.",
            "Pick 13 of " + " ".join(f"{chr(65 + i)}(1,1)" for i in range(26)) + " with cost<=99.",
        )
    ),
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
    st.sampled_from(
        (
            "3+5=8; 8^2=64; 3*5=15; 64-15=49; answer 49",
            "answer 5",
            "AB 7:7; AC 5:11; answer A,C",
            '{"ids": ["A", "B"]}',
            "Answer: 42",
            "\\boxed{42}",
            "48 / 2 = 24; 24 / 0 = 1",
            "2 x 3 x 4 = 24",
            '{"answer": NaN, "b": Infinity, "c": -1e999}',
            "",
            " ",
        )
    ),
    st.builds(lambda n: "a" * n + "!", st.sampled_from((30, 60, 1000, 4000, 4097))),
    st.builds(
        lambda u, n: u * n,
        st.sampled_from(("[", "{", "(", '{"a":', "\\boxed{", "Answer:", "=", "-", "1,000,")),
        st.sampled_from((100, 1000, 2000, 4096)),
    ),
    st.builds(lambda n: '{"a": ' + "[" * n + "]" * n + "}", st.sampled_from((50, 900, 2000))),
    st.builds(lambda n: 'x {"ids": ' + "[" * n + "]" * n + "}", st.sampled_from((50, 900, 2000))),
    st.builds(lambda n: "answer " + "9" * n, st.sampled_from((20, 4300, 4301, 5000))),
    st.builds(lambda n: "1+1=" + "9" * n + "; answer 2", st.sampled_from((20, 4301))),
    st.builds(lambda n: "AB " + "9" * n + ":3; answer A", st.sampled_from((20, 4301))),
    st.builds(lambda n: "Answer: " + "9" * n + ".5", st.sampled_from((20, 400, 4301))),
    st.builds(lambda n: "+".join(["1"] * n) + f"={n}; answer {n}", st.sampled_from((64, 65, 1000, 2000))),
    st.builds(lambda n: "-" * n + "1=1; answer 1", st.sampled_from((64, 1000, 4000))),
    st.builds(lambda n: '{"answer": "' + "a" * n + '!"}', st.sampled_from((20, 26, 30, 1000))),
    st.builds(lambda n: "{" + ",".join(f'"k{i}": {i}' for i in range(n)) + "}", st.sampled_from((100, 400))),
    st.builds(
        lambda n: '{"answer": [' + ",".join(f'{{"a": {i}}}' for i in range(n)) + "]}", st.sampled_from((300, 500))
    ),
    text(64),
)
REGEXES = st.one_of(
    st.sampled_from(
        (
            "(a+)+$",
            "(a|aa)+$",
            "(a|a)*b",
            "(.*a){20}",
            "((a*)*)*b",
            "^(\\d+)*$",
            "(?P<answer>(a|aa)+)$",
            "(?P<answer>(a+)+)$",
            "(?P<answer>\\d+)",
            "(?P<answer>.*)",
            "(?P<answer>(?R)?a)",
            "(?:abc){e<=3}",
            "\\",
            "(",
            "[",
            "(?P<answer>",
            "(?<=a+)b",
            "(?P<a>x)(?P=a)",
            "\\p{L}+",
            "(?V1)((a|b)*)*c",
            "a{1000000}",
            "(?:(?:a{100}){100}){100}",
            "(?i)(?P<answer>x{0,65535}){0,65535}",
            "x" * 513,
            "(?P<answer>" + "(a)" * 100 + ")",
            "(?P<" + "n" * 300 + ">a)",
        )
    ),
    text(48, big=False),
)
_DEFS = {
    f"d{i}": {"anyOf": [{"$ref": f"#/definitions/d{i + 1}"}, {"$ref": f"#/definitions/d{i + 1}"}]} for i in range(30)
}
SCHEMAS = st.one_of(
    st.sampled_from(
        (
            {"$ref": "#"},
            {"allOf": [{"$ref": "#"}]},
            {"$ref": "http://example.invalid/schema.json"},
            {"$ref": "file:///etc/passwd"},
            {"$ref": "#/definitions/nope"},
            {"definitions": _DEFS | {"d30": {"type": "integer"}}, "$ref": "#/definitions/d0"},
            {"properties": {"answer": {"type": "string", "pattern": "^(a+)+$"}}},
            {"patternProperties": {"^(a+)+$": {"type": "string"}}, "additionalProperties": False},
            {"additionalProperties": False, "patternProperties": {"(x+x+)+y": {}}},
            {"properties": {"answer": {"uniqueItems": True}}},
            {"type": "nonsense"},
            {"minLength": 1e308},
            {"multipleOf": 1e-308},
            {"multipleOf": 0},
            {"format": "regex"},
            {"enum": list(range(10_000))},
            {"$schema": "http://json-schema.org/draft-03/schema#", "properties": {"a": {"required": True}}},
            {"$schema": "https://evil.invalid/schema"},
            {"if": {"required": ["a"]}, "then": {"$ref": "#"}},
            {"properties": {"answer": {"maximum": math.nan}}},
            {"type": "object", "required": ["answer"] * 1000},
        )
    ),
    st.builds(nest, st.sampled_from(DEPTHS), st.just({}), st.sampled_from(("not", "items", "allOf"))),
    json_values(16).map(lambda v: v if isinstance(v, dict) else {"const": v}),
)
SHALLOW_SCHEMAS = SCHEMAS.filter(lambda sc: json_shape(sc)[0] <= 200)
"""Schemas json.dumps can write (it recurses per level): deeper ones are written by hand (RAW_BODIES)."""
NUMS = st.one_of(ints(-(2**64), 2**64), floats(), st.sampled_from((None, True, "5", [], {})))


@functools.cache
def rule_params(kind: str) -> st.SearchStrategy[dict]:
    """Params a rule of ``kind`` reads, with hostile values, plus stray keys."""
    fields_ = st.sampled_from(("answer", "ids", "answer_text", "", "missing")) | text(16, big=False)
    by_kind = {
        "numeric_bounds": {"field": fields_, "min": NUMS, "max": NUMS},
        "membership": {
            "field": fields_,
            "values": st.one_of(
                st.lists(json_values(2), max_size=4),
                NUMS,
                text(8),
                st.builds(lambda n: list(range(n)), st.sampled_from((1000, 100_000))),
            ),
        },
        "count": {"field": fields_, "min": NUMS, "max": NUMS, "unique": json_values(2)},
        "length": {"min": NUMS, "max": NUMS},
        "regex": {"pattern": REGEXES, "must_match": json_values(2)},
        "task_check": {"check": st.sampled_from(("arith_steps", "select_steps", "select_budget", "")) | text(8)},
        "json_schema": {"schema": SHALLOW_SCHEMAS},
    }.get(kind, {})
    return st.fixed_dictionaries({}, optional=by_kind | {"extra": json_values(4)})


def struct_of(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


RULE_KIND = weighted(
    (6, st.sampled_from(RULE_KINDS)), (1, st.sampled_from(("", "regexp", "JSON_SCHEMA"))), (1, text(16, big=False))
)
RULES_JSON = RULE_KIND.flatmap(
    lambda k: st.fixed_dictionaries({"kind": st.just(k)}, optional={"params": rule_params(k), "name": text(16)})
)
"""Rules as the HTTP API takes them ({"kind", "params", "name"})."""


def make_rule(kind: str, params: dict | None = None, name: str = "") -> pb.Rule:
    r = pb.Rule(kind=kind, name=name)
    r.params.update(params or {})  # in place: a constructor's copy would refuse what the server must refuse
    return r


def pb_rule() -> st.SearchStrategy[pb.Rule]:
    params = RULES_JSON.map(lambda r: r.get("params", {}))
    return st.builds(make_rule, RULE_KIND, params.filter(fits_struct), text(16, big=False))


def fits_struct(value: Any) -> bool:
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


EXTRACTIONS = st.builds(
    pb.Extraction,
    kind=st.one_of(st.sampled_from(range(7)), ints(-(2**31), 2**31 - 1)),
    pattern=REGEXES,
    marker=text(16) | st.sampled_from(("Answer:", "=", "\\boxed{", "x" * 65)),
)
ROLES = st.sampled_from(("system", "user", "assistant", "", "tool", "USER")) | text(8)
CHAT = st.builds(pb.ChatMessage, role=ROLES, content=PROMPTS)
SMALL_CHAT = st.builds(pb.ChatMessage, role=ROLES, content=text(16, big=False))
"""The element of a conversation of a thousand turns (of big ones, the example would take gigabytes)."""
VALID_PROBLEMS = st.sampled_from(
    (
        ("arith", "If x=3 and y=5, compute (x+y)^2-x*y."),
        ("arith", "If x=2 and y=7, compute x*y+x+y."),
        ("select", "Pick 2 of A(3,5) B(4,2) C(2,6) D(5,7) with cost<=8."),
        ("", "If x=4 and y=1, compute x^2-y."),
        ("", "Tom has 3 apples and buys 4 more. How many apples does he have?"),
        ("", "Say hello."),
    )
)
RUNTIME_RULES = st.one_of(  # valid rules that run a client's program on every draft
    st.builds(lambda p, m: make_rule("regex", {"pattern": p, "must_match": m}), REGEXES, st.booleans()),
    SCHEMAS.filter(lambda sc: fits_struct({"schema": sc})).map(lambda sc: make_rule("json_schema", {"schema": sc})),
    st.sampled_from(
        (
            make_rule("arithmetic"),
            make_rule("length", {"max": 512}),
            make_rule("numeric_bounds", {"field": "answer", "min": -1e9, "max": 1e9}),
            make_rule("task_check", {"check": "arith_steps"}),
        )
    ),
)
VALID_EXTRACTIONS = st.one_of(
    st.builds(pb.Extraction, kind=st.sampled_from(range(7)), marker=st.sampled_from(("", "Answer:", "answer"))),
    st.builds(
        lambda p, named: pb.Extraction(kind=pb.EXTRACTION_KIND_REGEX, pattern=f"(?P<answer>{p})" if named else p),
        REGEXES,
        st.booleans(),
    ),
)


def sampling() -> st.SearchStrategy[pb.SamplingParams]:
    return st.builds(
        pb.SamplingParams,
        temperature=mostly(st.floats(0, 2, width=32), floats(32)),
        top_p=mostly(st.floats(0, 1, width=32), floats(32)),
        presence_penalty=mostly(st.floats(-2, 2, width=32), floats(32)),
        frequency_penalty=mostly(st.floats(-2, 2, width=32), floats(32)),
        max_new_tokens=mostly(st.integers(*CHEAP_TOKENS), ints(0, 2**32 - 1)),
        seed=mostly(st.integers(0, 1000), ints(0, 2**64 - 1)),
        stop=mostly(
            st.lists(st.sampled_from(("\n", ";", "answer", "Answer:")), max_size=2),
            st.lists(text(70, big=False), max_size=9),
        ),
    )


def problem() -> st.SearchStrategy[pb.Problem]:
    """A problem whose task and prompt agree (or not), with rules, extraction and a conversation that
    are mostly valid: a hostile regex or schema then runs on real drafts."""

    def build(
        base: tuple[str, str],
        task: str | None,
        prompt: str | None,
        rules: list,
        chat: list | None,
        extraction: pb.Extraction | None,
    ) -> pb.Problem:
        p = pb.Problem(task=base[0] if task is None else task, rules=rules)
        if chat is None:
            p.prompt = base[1] if prompt is None else prompt
        else:
            p.messages.extend(chat + [pb.ChatMessage(role="user", content=base[1] if prompt is None else prompt)])
        if extraction is not None:
            p.extraction.CopyFrom(extraction)
        return p

    many = st.builds(lambda m, n: [m] * n, SMALL_CHAT, st.sampled_from((65, 1000)))
    rules = weighted(
        (4, st.just([])), (3, st.lists(RUNTIME_RULES, min_size=1, max_size=2)), (1, st.lists(pb_rule(), max_size=3))
    )
    chat = weighted(
        (5, st.none()),
        (1, st.just([pb.ChatMessage(role="system", content="Be brief.")])),
        (1, weighted((9, st.lists(CHAT, max_size=3)), (1, many))),
    )
    return st.builds(
        build,
        VALID_PROBLEMS,
        mostly(st.none(), st.sampled_from(("", "arith", "select", "ARITH", "arith ", "poetry")) | text(8)),
        mostly(st.none(), PROMPTS),
        rules,
        chat,
        weighted((4, st.none()), (2, VALID_EXTRACTIONS), (1, EXTRACTIONS)),
    )


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
    return cheap(
        st.builds(
            pb.SessionOpen,
            request_id=REQUEST_IDS,
            problem=problem(),
            refine=sampling(),
            expected_drafts=mostly(st.integers(0, 8), ints(0, 2**32 - 1)),
            deadline_ms=mostly(st.integers(*CHEAP_DEADLINE_MS), ints(0, 2**32 - 1)),
        )
    )


def draft() -> st.SearchStrategy[pb.Draft]:
    return st.builds(
        pb.Draft,
        index=ints(0, 2**32 - 1),
        text=DRAFTS,
        num_tokens=mostly(st.integers(0, 300), ints(0, 2**32 - 1)),
        mean_logprob=mostly(st.floats(-5, 0, width=32), floats(32)),
        edge_ms=floats(32),
    )
