"""Regular expressions written by clients (``regex`` rules, ``regex`` extraction): matched with a hard
time budget, so no pattern can hold a server.

Python's ``re`` backtracks without bound: ``(a|aa)+$`` over a few dozen characters runs for seconds
and holds the event loop, and therefore every other request on the process. Patterns from clients
go through the ``regex`` module instead (a superset of ``re``'s syntax), whose matching takes a
``timeout``: a match that needs more than ``BUDGET_S`` stops with ``RegexTimeout``, which the caller
turns into a failed rule or extraction naming the pattern -- never an error of the server. The
module also avoids much of the backtracking ``re`` does (``(a+)+$`` is linear there), so the budget
is the backstop, not the common path. Our own parsers do not use this: they are linear by construction.
"""

from __future__ import annotations

import regex

BUDGET_S = 0.02
"""Most time one client pattern may take on one text (20 ms: a serving loop must never stall longer)."""


class RegexTimeout(Exception):
    """A client pattern exceeded its time budget on this text."""


def compile(pattern: str) -> regex.Pattern:  # noqa: A001 - the module's own verb
    """Compile a client pattern (``regex.error`` if invalid)."""
    return regex.compile(pattern)


def search(rx: regex.Pattern, text: str) -> regex.Match | None:
    try:
        return rx.search(text, timeout=BUDGET_S)
    except TimeoutError:
        raise RegexTimeout(f"/{rx.pattern}/ took over {BUDGET_S * 1e3:.0f} ms") from None


def last_match(rx: regex.Pattern, text: str) -> regex.Match | None:
    """The last non-overlapping match, within one budget for the whole scan."""
    last = None
    try:
        for last in rx.finditer(text, timeout=BUDGET_S):  # noqa: B007 - the last one wins
            pass
    except TimeoutError:
        raise RegexTimeout(f"/{rx.pattern}/ took over {BUDGET_S * 1e3:.0f} ms") from None
    return last
