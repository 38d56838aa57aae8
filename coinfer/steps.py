"""A streamed answer's steps: where one ends, which rule patterns can judge a prefix cut there, and how
much of a step in progress may stream before it ends (docs/api.md, Streaming).

The cloud streams its own answer as final step by step where the rules can judge a prefix that ends a
step (``step_ends``; ``coinfer.rules``). Within a step, text may leave earlier where nothing that follows
can make what left fail:

- a preset's step (``Task.step_completion``): while what the model wrote of it begins a right step the
  calculator can end, all of it; whatever the model writes next, the calculator ends the step rightly.
- open text judged by the ``arithmetic`` rule alone (the other rules reading only the answer's end):
  up to the last character that breaks every chain of numbers (a letter, most punctuation), where each
  equation before it is complete and right, and short of a tail that may begin the extraction's marker
  (``Answer:``). An equation still being written (``48 / 2 = 2``: is it 24?) waits for its chain to end.

Pure and bounded: a step in progress is read up to ``MAX_OPEN_STEP_CHARS`` characters, once per token;
the rest is linear in the text.
"""

from __future__ import annotations

from coinfer.arithmetic import first_wrong_equation

_END_ESCAPES = frozenset("bBmMZz")
"""Escapes whose match at a text's end depends on what follows it: word boundaries, end of text."""


def end_sensitive(pattern: str) -> bool:
    """Whether ``pattern`` may look past the end of the text it runs on (``$``, an end-of-text or word
    boundary escape, a lookahead): its verdict on a prefix may not be the whole's. Conservative: a
    literal ``\\$`` or ``[$]`` counts as well. Linear in the pattern."""
    if "$" in pattern or "(?=" in pattern or "(?!" in pattern:
        return True
    i = pattern.find("\\")
    while 0 <= i < len(pattern) - 1:
        if pattern[i + 1] in _END_ESCAPES:
            return True
        i = pattern.find("\\", i + 2)
    return False


STEP_ENDS = "\n;"
"""Characters that end a step (``coinfer.tasks.base.split_steps``'s separators, a line's end)."""
SENTENCE_ENDS = ".!?"
"""...and a sentence's end, where a space follows it (so ``3.5`` and ``e.g.,`` do not end one)."""


def step_ends(text: str, start: int = 0) -> list[int]:
    """The ends (exclusive) of the steps ``text`` completes after ``start``, in order: after a line
    break or a ``;``, or after a ``.``/``!``/``?`` that whitespace follows (the whitespace begins the
    next step). No chain of numbers, no equation spans one (``coinfer.arithmetic`` breaks chains
    there), so a prefix cut at one holds every equation whole. Linear in the text after ``start``."""
    out = []
    for i in range(start, len(text)):
        ch = text[i]
        if ch in STEP_ENDS or (ch in SENTENCE_ENDS and i + 1 < len(text) and text[i + 1].isspace()):
            out.append(i + 1)
    return out


MAX_OPEN_STEP_CHARS = 256
"""The longest step in progress open text streams within (a sentence is some 40-120 characters):
past it the step waits for its end, and the per-token check stays bounded."""

CHAIN_CHARS = frozenset("0123456789+-*/=$ \t,.x")
"""Characters that may continue a chain of numbers (``coinfer.arithmetic``: digits, operators, ``=``,
spacing and ``$``; ``,`` and ``.`` inside numbers; ``x`` as times): conservative, so every other ASCII
character ends any chain before it. A non-ASCII character counts as a chain's too (``normalize`` may map
it to one: a Unicode minus, a full-width digit)."""


def open_step_shown(partial: str, marker: str) -> int | None:
    """How many characters of ``partial`` -- the beginning of a step of open text, no step's end in it
    -- may stream now: through its last chain-breaking character, short of a tail that begins
    ``marker``. None where the step can stream no further before it ends: a wrong equation in what would
    leave (the step fails at its end: the cloud corrects it from there), the marker itself (the answer's
    end has begun: held whole), a step past ``MAX_OPEN_STEP_CHARS``."""
    if len(partial) > MAX_OPEN_STEP_CHARS or (marker and marker in partial):
        return None
    n = len(partial)
    while n and (partial[n - 1] in CHAIN_CHARS or not partial[n - 1].isascii()):
        n -= 1
    for i in range(min(len(marker) - 1, n), 0, -1):  # "... A" may begin "Answer:"
        if partial.endswith(marker[:i], 0, n):
            n -= i
            break
    if first_wrong_equation(partial[:n]):
        return None
    return n
