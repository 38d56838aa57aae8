"""Answer extraction, declared per request: how the answer is taken out of a draft's text.

=========  ==================================================  ==========================
kind       fields                                              parse error when
=========  ==================================================  ==========================
none       {} (rules see the whole text only)                  never
marker     answer (+ answer_text): text after the last marker  no marker / nothing after it
           (default ``Answer:``) to the end of its line
boxed      answer (+ answer_text): the last ``\\boxed{...}``     no complete \\boxed{...}
last_line  answer (+ answer_text): the last non-empty line     empty text
json       the object's keys (the whole draft, else the last   no JSON object
           ``{...}`` in it that parses)
regex      the named groups of the last match (``answer``      no match
           is the answer)
=========  ==================================================  ==========================

A number at the start of an extracted answer (``72``, ``-3.5``, ``$1,200``, ``72 clips``)
becomes the numeric ``answer``; the extracted text stays in ``answer_text``. Every kind but
``regex`` runs in linear time with string operations (no backtracking on untrusted text);
``regex`` runs the client's pattern (bounded in length; its time is bounded too).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import regex

from coinfer import userregex
from coinfer.errors import InvalidArgument, require
from coinfer.text import normalize

KINDS = ("none", "marker", "boxed", "last_line", "json", "regex")
DEFAULT_MARKER = "Answer:"
MAX_PATTERN = 512
MAX_MARKER = 64
_JSON_TRIES = 32  # '{' positions tried from the end: bounds a draft full of braces
MAX_DIGITS = 64
"""A longer run of digits is not a number any parser reads: no answer needs one, ``int()`` refuses runs
past 4,300 digits (a ValueError out of a parser that must never raise), and a double overflows past 308."""
_LONG_NUMBER = re.compile(rf"\d{{{MAX_DIGITS + 1}}}")


def long_number(text: str) -> bool:
    """Whether ``text`` has a run of more than ``MAX_DIGITS`` digits."""
    return _LONG_NUMBER.search(text) is not None


MAX_JSON_DEPTH = 16
"""Deepest JSON an extraction accepts: its fields go through recursive code (rules, JSON Schema, the
wire's Struct, which protobuf parses at most 100 messages deep), and a draft of 2,000 brackets would
recurse past Python's limit."""


@dataclass
class Parsed:
    """A parsed answer. ``error`` is set (and ``fields`` partial) when parsing failed."""

    fields: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


_DIGITS = frozenset("0123456789")


def _digits_end(s: str, i: int) -> int:
    while i < len(s) and s[i] in _DIGITS:
        i += 1
    return i


def number(text: str) -> int | float | None:
    """The number ``text`` starts with (``$1,200.50 total`` -> 1200.5), else None. One linear scan."""
    s = text.strip().lstrip("$€£").strip()
    i = 1 if s[:1] in ("+", "-") else 0
    j = _digits_end(s, i)
    if j == i:
        return None
    raw = s[:j]
    while s[j : j + 1] == "," and _digits_end(s, j + 1) == j + 4:  # thousands separators
        raw += s[j + 1 : j + 4]
        j += 4
    if s[j : j + 1] == "." and s[j + 1 : j + 2] in _DIGITS:
        k = _digits_end(s, j + 1)
        if k - i > MAX_DIGITS:
            return None
        return float(raw + s[j:k])
    return int(raw) if len(raw) - i <= MAX_DIGITS else None


PLACEHOLDERS = frozenset({"n", "x", "?", "...", "\u2026", "answer", "your answer", "the answer", "number", "value"})
"""Answers that are an instruction's placeholder (compared lower-case): "Answer: N" copied from a
template is not the value N. A single letter other than N/X stays an answer (multiple choice)."""


def is_placeholder(value: Any) -> bool:
    """``value`` (an extracted answer) is a placeholder: one of ``PLACEHOLDERS``, or a word wrapped
    in <...>, [...] or {...} ("<int>", "[answer]")."""
    if not isinstance(value, str):
        return False
    v = value.strip()
    if v.lower() in PLACEHOLDERS:
        return True
    return (
        len(v) <= 40
        and len(v) >= 3
        and v[0] + v[-1] in ("<>", "[]", "{}")
        and v[1:-1].replace("_", " ").replace("-", " ").replace(" ", "").isalpha()
    )


def _answer(text: str) -> dict[str, Any]:
    text = text.strip()
    num = number(text)
    return {"answer": text if num is None else num, "answer_text": text}


def _boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...} (nested braces balanced): one pass with a stack."""
    opens: list[tuple[int, bool]] = []  # (position after '{', whether it opened a \boxed)
    last: tuple[int, int] | None = None
    i, tag = 0, "\\boxed{"
    while i < len(text):
        if text.startswith(tag, i):
            opens.append((i + len(tag), True))
            i += len(tag)
            continue
        ch = text[i]
        if ch == "{":
            opens.append((i + 1, False))
        elif ch == "}" and opens:
            start, boxed = opens.pop()
            if boxed and (last is None or start > last[0]):
                last = (start, i)
        i += 1
    return text[last[0] : last[1]] if last else None


def json_shape(value: Any, max_nodes: int = 1 << 16) -> tuple[int, int]:
    """(nesting depth, values) of a JSON value (a scalar: (1, 1)), level by level: no recursion on hostile
    input, and the count stops soon after ``max_nodes``."""
    depth, nodes, level = 0, 0, [value]
    while level and nodes <= max_nodes:
        depth += 1
        nodes += len(level)
        level = [x for v in level if isinstance(v, (dict, list)) for x in (v.values() if isinstance(v, dict) else v)]
    return depth, nodes


def _finite(number: str) -> float:
    """A JSON number as a double; one past its range (``1e999``) is not JSON the answer can carry: every
    consumer (the wire's Struct, an HTTP body) refuses inf."""
    v = float(number)
    if not math.isfinite(v):
        raise ValueError(f"number out of range: {number[:20]}")
    return v


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")  # Python's decoder would read NaN / Infinity


# numbers as JSON defines them: a long integer is a double (int() refuses 4,300 digits), NaN and inf are not numbers
_DECODER = json.JSONDecoder(
    parse_int=lambda d: int(d) if len(d) <= MAX_DIGITS else _finite(d), parse_float=_finite, parse_constant=_no_constant
)


def _json_object(text: str) -> Any:
    """The whole text as JSON, else the last ``{...}`` that parses (a bounded number of tries).
    Nesting that recurses past Python's limit does not parse."""
    dec = _DECODER
    try:
        return dec.decode(text)
    except (ValueError, RecursionError):
        pass
    pos, tries = len(text), 0
    while tries < _JSON_TRIES:
        pos = text.rfind("{", 0, pos)
        if pos < 0:
            return None
        tries += 1
        try:
            return dec.raw_decode(text, pos)[0]
        except (ValueError, RecursionError):
            continue
    return None


@dataclass(frozen=True)
class Extraction:
    """An extraction rule. ``kind`` "" means the default: a built-in task's own parser, else none."""

    kind: str = ""
    pattern: str = ""
    """regex: a Python pattern with at least one named group."""
    marker: str = ""
    """marker: the marker text; empty = ``Answer:``."""

    def validate(self, field: str = "extraction") -> None:
        require(
            self.kind in KINDS + ("",), f"{field}.kind", f"unknown extraction {self.kind!r} (known: {', '.join(KINDS)})"
        )
        require(len(self.marker) <= MAX_MARKER, f"{field}.marker", f"at most {MAX_MARKER} chars")
        if self.kind == "regex":
            require(
                0 < len(self.pattern) <= MAX_PATTERN, f"{field}.pattern", f"required string of 1..{MAX_PATTERN} chars"
            )
            self.compiled(f"{field}.pattern")

    def compiled(self, field: str = "extraction.pattern") -> regex.Pattern:
        try:
            rx = userregex.compile(self.pattern)
        except regex.error as exc:
            raise InvalidArgument(f"{field}: invalid regex: {exc}") from None
        require(bool(rx.groupindex), field, "needs a named group, e.g. (?P<answer>...)")
        return rx

    def __call__(self, text: str) -> Parsed:
        """Text -> Parsed. Never raises: dirty text gives ``Parsed(error=...)``. An ``answer`` that is
        a placeholder copied from an instruction ("Answer: N", "<answer>") is no answer."""
        parsed = self._extract(text)
        if parsed.ok and is_placeholder(parsed.fields.get("answer_text", parsed.fields.get("answer"))):
            return Parsed({}, f"parse_error: the answer {parsed.fields['answer']!r} is a placeholder, not a value")
        return parsed

    def _extract(self, text: str) -> Parsed:
        clean = normalize(text)
        kind = self.kind or "none"
        if kind == "none":
            return Parsed({})
        empty = " (empty)" if not clean.strip() else ""
        if kind == "marker":
            marker = self.marker or DEFAULT_MARKER
            at = clean.rfind(marker)
            if at < 0:
                return Parsed({}, f"parse_error: no {marker!r} marker found{empty or ' (truncated?)'}")
            line = clean[at + len(marker) :].split("\n", 1)[0]
            if not line.strip():
                return Parsed({}, f"parse_error: nothing after {marker!r}")
            return Parsed(_answer(line))
        if kind == "boxed":
            box = _boxed(clean)
            if box is None or not box.strip():
                return Parsed({}, "parse_error: no complete \\boxed{...} found" + empty)
            return Parsed(_answer(box))
        if kind == "last_line":
            lines = [ln for ln in clean.split("\n") if ln.strip()]
            return Parsed(_answer(lines[-1])) if lines else Parsed({}, "parse_error: empty text")
        if kind == "json":
            obj = _json_object(clean)
            if obj is None:
                return Parsed({}, "parse_error: no JSON object found" + empty)
            if json_shape(obj)[0] > MAX_JSON_DEPTH:
                return Parsed({}, f"parse_error: JSON nested deeper than {MAX_JSON_DEPTH} levels")
            return Parsed(dict(obj) if isinstance(obj, dict) else {"answer": obj})
        # regex (a client's pattern: matched within a time budget)
        try:
            last = userregex.last_match(self.compiled(), clean)
        except userregex.RegexTimeout as exc:
            return Parsed({}, f"parse_error: {exc} on this text")
        if last is None:
            return Parsed({}, f"parse_error: no match for /{self.pattern}/")
        fields: dict[str, Any] = {}
        for name, value in last.groupdict().items():
            if value is not None:
                fields.update(_answer(value) if name == "answer" else {name: value})
        return Parsed(fields)


def answer_key(parsed: Parsed) -> Any:
    """What drafts agree on: the extracted answer (numbers compared as numbers), else every field."""
    if "answer" in parsed.fields:
        v = parsed.fields["answer"]
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v).strip().lower()
    return json.dumps(parsed.fields, sort_keys=True, default=str) if parsed.fields else None
