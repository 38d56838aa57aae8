"""Hostile values: sizes at and past every limit, special text, extreme numbers, deep nesting; and the
budgets a valid request is cheapened to."""

from __future__ import annotations

import functools
import math
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

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
    "",
    " ",
    "\x00",
    "\n\n\n",
    "\t",
    "\r\n",
    "\u202e",
    "\ufeff",
    "\u200b",
    "\U0001f642",
    "A\u0301",
    "\ufdfa",
    "\u0130",
    "\uffff",
    "\U0010ffff",
    "NaN",
    "-0",
    "null",
    "true",
    "%s%s%n",
    "{}",
    "[]",
    "{{x}}",
    "${x}",
    "../../../etc/passwd",
    "C:\\Windows\\win.ini",
    "<script>",
    "' OR 1=1 --",
    "Answer:",
    "answer 5",
    "\\boxed{",
    "}",
    "If x=1 and y=2, compute x+y.",
    "Pick 2 of A(1,2) B(3,4) with cost<=5.",
    "system",
    "user",
    "assistant",
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
    choices = [
        (12, st.text(max_size=max_size)),
        (6, st.text(st.characters(categories=cats), max_size=max_size)),
        (9, st.sampled_from(SPECIAL_TEXT)),
    ]
    if surrogates:
        choices.append((3, st.text(st.characters(categories=["Cs", "Ll"]), min_size=1, max_size=4)))
    if big:
        choices.append((1, st.builds(repeat, st.sampled_from(BIG_UNITS), SIZES)))
    return weighted(*choices)


@functools.cache
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    """The range's edges and the usual overflow points inside it, or any value in it."""
    edges = (
        lo,
        hi,
        0,
        1,
        -1,
        2,
        7,
        8,
        16,
        17,
        64,
        65,
        255,
        256,
        1000,
        4096,
        2**15,
        2**16,
        16 << 20,
        (16 << 20) + 1,
        600_000,
        600_001,
        2**31 - 1,
        2**31,
        2**32 - 1,
        2**53 + 1,
        2**63 - 1,
    )
    return st.one_of(st.sampled_from(sorted({v for v in edges if lo <= v <= hi})), st.integers(lo, hi))


@functools.cache
def floats(width: int = 64) -> st.SearchStrategy[float]:
    edges = (
        math.nan,
        math.inf,
        -math.inf,
        0.0,
        -0.0,
        1e-45,
        -1.0,
        0.5,
        1.0,
        1.0000001,
        2.0,
        2.0000002,
        3.4e38,
        -3.4e38,
    ) + ((1e308, -1e308, 5e-324) if width == 64 else ())
    return st.one_of(st.sampled_from(edges), st.floats(width=width))


INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}


@functools.cache
def json_values(max_leaves: int = 12, surrogates: bool = False) -> st.SearchStrategy:
    """Any JSON shape: numbers at their extremes (NaN and inf too: Python's json reads them), hostile strings."""
    leaf = st.one_of(
        st.none(), st.booleans(), ints(-(2**64), 2**64), floats(), text(16, big=False, surrogates=surrogates)
    )
    return st.recursive(
        leaf,
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(text(8, big=False, surrogates=surrogates), kids, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def nest(depth: int, inner: Any = 1, key: str | None = "a") -> Any:
    """``depth`` levels of objects (``key``) or arrays (None) around ``inner``, built without recursion."""
    for _ in range(depth):
        inner = {key: inner} if key is not None else [inner]
    return inner


DEPTHS = (20, 40, 100, 500, 3000)
