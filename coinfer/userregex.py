"""Regular expressions written by clients (``regex`` rules, ``regex`` extraction): matched with a hard
time budget, so no pattern can hold a server.

Python's ``re`` backtracks without bound: ``(a|aa)+$`` over a few dozen characters runs for seconds
and holds the event loop, and therefore every other request on the process. Patterns from clients
go through the ``regex`` module instead (a superset of ``re``'s syntax), whose matching takes a
``timeout``: a match that needs more than ``BUDGET_S`` stops with ``RegexTimeout``, which the caller
turns into a failed rule or extraction naming the pattern -- never an error of the server. The
module also avoids much of the backtracking ``re`` does (``(a+)+$`` is linear there), so the budget
is the backstop, not the common path. Our own parsers do not use this: they are linear by construction.

Two more ways a pattern holds a process:

- compiling: the module expands counted repeats, so ``a{1000000}`` (10 characters) takes ~0.4 s to
  compile, ``(a{1000}){1000}`` the same. ``compile`` first estimates that expansion with a linear
  scan (``expanded_size``) and refuses a pattern over ``MAX_EXPANDED`` elements (~3 ms to compile).
- the GIL: ``regex`` holds it while matching unless asked not to, so a match in a worker thread still
  froze the event loop for its whole budget. Matches here pass ``concurrent=True``.
"""

from __future__ import annotations

import regex

BUDGET_S = 0.02
"""Most time one client pattern may take on one text (20 ms: a serving loop must never stall longer)."""

MAX_EXPANDED = 10_000
"""Most elements a client pattern may compile to, counted repeats expanded (``expanded_size``)."""


class RegexTimeout(Exception):
    """A client pattern exceeded its time budget on this text."""


def compile(pattern: str) -> regex.Pattern:  # noqa: A001 - the module's own verb
    """Compile a client pattern (``regex.error`` if invalid or too large to compile quickly)."""
    size = expanded_size(pattern)
    if size > MAX_EXPANDED:
        raise regex.error(
            f"pattern expands to about {size} elements (counted repeats multiplied out); the limit is {MAX_EXPANDED}"
        )
    return regex.compile(pattern)


_HUGE = 10**12
_BRACED_ESCAPES = frozenset("pPNxuUgkL")  # \p{Greek}, \x{263a}, \g<1>...: their braces are not repeats


def _repeat(pattern: str, i: int) -> tuple[int, int] | None:
    """``{n}``, ``{n,}``, ``{,m}``, ``{n,m}`` at ``pattern[i]``: (minimum count, index after it)."""
    j, n = i + 1, len(pattern)
    while j < n and pattern[j].isdigit():
        j += 1
    lo = pattern[i + 1 : j]
    if j < n and pattern[j] == ",":
        j += 1
        while j < n and pattern[j].isdigit():
            j += 1
    if j >= n or pattern[j] != "}" or j == i + 1 or (not lo and pattern[j - 1] == ","):
        return None
    return (int(lo) if lo and len(lo) < 10 else (10**9 if lo else 0)), j + 1


def expanded_size(pattern: str) -> int:
    """Elements ``pattern`` compiles to, each counted repeat multiplied out by its minimum (the part
    the module expands; ``\\w{1,60000}`` compiles as fast as ``\\w``). A linear scan, never an
    underestimate for the syntax that expands: it counts every alternative and group prefix."""
    totals, last = [0], 0  # per open group: its size so far; size of the last atom (what a repeat applies to)
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            if i - 1 < n and pattern[i - 1] in _BRACED_ESCAPES and i < n and pattern[i] in "{<":
                close = pattern.find("}" if pattern[i] == "{" else ">", i)
                i = n if close < 0 else close + 1
            totals[-1] += 1
            last = 1
        elif c == "[":  # a set is one element: skip to its end (escapes and [:posix:] classes inside)
            i += 2 if i + 1 < n and pattern[i + 1] == "]" else 1
            while i < n and pattern[i] != "]":
                if pattern[i] == "\\":
                    i += 1
                elif pattern.startswith("[:", i):
                    close = pattern.find(":]", i + 2)
                    i = i if close < 0 else close + 1
                i += 1
            i += 1
            totals[-1] += 1
            last = 1
        elif c == "(":
            totals.append(0)
            i += 1
        elif c == ")":
            last = max(1, totals.pop()) if len(totals) > 1 else 1
            totals[-1] += last
            i += 1
        elif c == "{" and (rep := _repeat(pattern, i)) is not None:
            count, i = rep
            if count > 1:  # capped: the exact size of a refused pattern does not matter, big-int time does
                totals[-1] = min(_HUGE, totals[-1] + last * (count - 1))
                last = min(_HUGE, last * count)
        else:
            totals[-1] += 1
            last = 1
            i += 1
    return sum(totals)


def search(rx: regex.Pattern, text: str) -> regex.Match | None:
    try:
        return rx.search(text, timeout=BUDGET_S, concurrent=True)  # the GIL is free meanwhile
    except TimeoutError:
        raise RegexTimeout(f"/{rx.pattern}/ took over {BUDGET_S * 1e3:.0f} ms") from None


def last_match(rx: regex.Pattern, text: str) -> regex.Match | None:
    """The last non-overlapping match, within one budget for the whole scan."""
    last = None
    try:
        for last in rx.finditer(text, timeout=BUDGET_S, concurrent=True):  # noqa: B007 - the last one wins
            pass
    except TimeoutError:
        raise RegexTimeout(f"/{rx.pattern}/ took over {BUDGET_S * 1e3:.0f} ms") from None
    return last
