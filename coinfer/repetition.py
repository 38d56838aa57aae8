"""Degenerate repetition: the loop a language model falls into ("a leaf's fate is determined a leaf's
fate is determined ..."), which a likelihood verifier loves (each repeat is more likely than the last).

Two linear-time signals, both over the whole text (client text: no regex, bounded by the draft size
limit):

- word n-grams: the share of the text's 4-word sequences that occur ``MIN_REPEATS`` or more times.
  Prose, step-by-step solutions and lists stay far below ``MAX_REPEATED_SHARE`` (a refrain or a
  repeated formula is a small part of an answer); a loop approaches 1.
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
MIN_COMPRESSION_BYTES = 200
MIN_COMPRESSION = 0.12


def repetition_error(text: str) -> str:
    """An error naming the repetition when ``text`` is degenerate, else ""."""
    words = text.split()
    if len(words) >= MIN_WORDS:
        grams = Counter(zip(*(words[i:] for i in range(NGRAM))))
        total = len(words) - NGRAM + 1
        repeated = sum(c for c in grams.values() if c >= MIN_REPEATS)
        if repeated >= MAX_REPEATED_SHARE * total:
            top, n = grams.most_common(1)[0]
            return (f"repetition: {repeated / total:.0%} of the text's {NGRAM}-word sequences occur "
                    f"{MIN_REPEATS}+ times (e.g. {' '.join(top)[:60]!r} x{n})")
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) >= MIN_COMPRESSION_BYTES:
        ratio = len(zlib.compress(raw, 6)) / len(raw)
        if ratio < MIN_COMPRESSION:
            return f"repetition: the text compresses to {ratio:.0%} of its {len(raw)} bytes (a loop)"
    return ""
