"""Text clean-up for dirty drafts: smart quotes, unicode operators, stray spaces.

Small models (and big ones) write typographic quotes and minus signs that break
JSON and number parsing (docs/design.md §5.1). Every parser normalises first.
"""

from __future__ import annotations

import unicodedata

_TRANSLATE = str.maketrans(
    {
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u201f": '"',
        "\u2033": '"',
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u2032": "'",
        "\u2212": "-",
        "\u2013": "-",
        "\u2014": "-",
        "\u00d7": "*",
        "\u22c5": "*",
        "\u00b7": "*",
        "\u00f7": "/",
        "\uff1d": "=",
        "\uff1b": ";",
        "\uff0c": ",",
        "\uff1a": ":",
        "\u00a0": " ",
        "\u3000": " ",
    }
)


def normalize(text: str) -> str:
    """NFKC-normalise, map typographic punctuation to ASCII, drop control chars."""
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE)
    return "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C")
