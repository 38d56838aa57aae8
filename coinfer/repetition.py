"""Degenerate repetition: the loop a language model falls into ("a leaf's fate is determined a leaf's
fate is determined ..."), which a likelihood verifier loves (each repeat is more likely than the last).

Two linear-time signals, both over the whole text (client text: no regex, bounded by the draft size
limit):

- word n-grams: the share of the text's 4-word sequences that occur ``MIN_REPEATS`` or more times.
  Prose, step-by-step solutions and lists stay far below ``MAX_REPEATED_SHARE`` (a refrain or a
  repeated formula is a small part of an answer); a loop approaches 1. The same share over the last
  ``TAIL_WORDS`` words finds a loop that has begun at the end of a longer text, before it is half the
  text: the cloud stops its own generation there (SmolLM2's greedy haiku loops after 17 words, which
  the whole-text share saw only ~100 tokens later, each a decode step the user waited for).
- compression: a long text that zlib shrinks below ``MIN_COMPRESSION`` of its size (loops without
  spaces: "!!!!", a repeated CJK phrase, a repeated token). English compresses to ~35-45%.

Checked before every rule on the edge and the cloud (``coinfer.rules.RuleSet.check``), so a looping
draft, refinement or cloud answer is invalid with this error and never returned as verified.
"""

from __future__ import annotations

import zlib
from collections import Counter

NGRAM = 4
MIN_WORDS = 24
"""Below this many words a text is too short to call a loop (a repeated short answer is fine)."""
MIN_REPEATS = 3
MAX_REPEATED_SHARE = 0.5
TAIL_WORDS = 36
"""A phrase of up to 12 words repeated 3 times fills it (a refrain in prose is further apart)."""
MIN_COMPRESSION_BYTES = 200
MIN_COMPRESSION = 0.12
FINISH_REASON = "repetition"
"""The ``finish_reason`` of an answer whose generation was stopped where it fell into a loop (OpenAI's
own are "stop" and "length"; a loop is neither: the model did not end, nor reach its budget)."""


def _repeated(words: list[str]) -> tuple[float, tuple[str, ...], int]:
    """(share of the 4-word sequences occurring ``MIN_REPEATS``+ times, the most common one, its count)."""
    grams = Counter(zip(*(words[i:] for i in range(NGRAM))))
    total = len(words) - NGRAM + 1
    top, n = grams.most_common(1)[0]
    return sum(c for c in grams.values() if c >= MIN_REPEATS) / total, top, n


def repetition_error(text: str) -> str:
    """An error naming the repetition when ``text`` is degenerate, else ""."""
    words = text.split()
    if len(words) >= MIN_WORDS:
        share, top, n = _repeated(words)
        if share >= MAX_REPEATED_SHARE:
            return (
                f"repetition: {share:.0%} of the text's {NGRAM}-word sequences occur "
                f"{MIN_REPEATS}+ times (e.g. {' '.join(top)[:60]!r} x{n})"
            )
    if len(words) > TAIL_WORDS:
        share, top, n = _repeated(words[-TAIL_WORDS:])
        if share >= MAX_REPEATED_SHARE:
            return (
                f"repetition: the text ends in a loop ({share:.0%} of its last {TAIL_WORDS} words' "
                f"{NGRAM}-word sequences occur {MIN_REPEATS}+ times, e.g. {' '.join(top)[:60]!r} x{n})"
            )
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) >= MIN_COMPRESSION_BYTES:
        ratio = len(zlib.compress(raw, 6)) / len(raw)
        if ratio < MIN_COMPRESSION:
            return f"repetition: the text compresses to {ratio:.0%} of its {len(raw)} bytes (a loop)"
    return ""
