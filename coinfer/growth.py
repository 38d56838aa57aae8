"""How much of a step in progress may stream before the step ends (docs/api.md, Streaming).

The cloud streams its own answer as final step by step where the rules can judge a prefix that ends a
step (``coinfer.rules``). Within a step, text may leave earlier where nothing that follows can make what
left fail:

- a preset's step (``Task.step_completion``): while what the model wrote of it begins a right step the
  calculator can end, all of it; whatever the model writes next, the calculator ends the step rightly.
- open text judged by the ``arithmetic`` rule alone (the other rules reading only the answer's end):
  up to the last character that breaks every chain of numbers (a letter, most punctuation), where each
  equation before it is complete and right, and short of a tail that may begin the extraction's marker
  (``Answer:``). An equation still being written (``48 / 2 = 2``: is it 24?) waits for its chain to end.

Pure and bounded: a step is read up to ``MAX_OPEN_STEP_CHARS`` characters, once per token.
"""

from __future__ import annotations

from coinfer.arithmetic import first_wrong_equation

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
