"""The rows exact checks computed (the target's top token at a position and its lead over the runner-up), kept
by the tokens before them: what vLLM's prefix cache cannot give back.

vLLM writes no prompt-logprob row for a position its prefix cache served. A check whose prompt and draft an
earlier request computed finds them there -- a repeated prompt's greedy draft is the same tokens, and so is a
draft the target had already taken -- and used to be asked again without the cache, the whole prompt
recomputed (38% of the checks of held-out word problems under load, ``benchmarks.capacity``). The rows of
those positions are the ones an earlier check computed from the same tokens: kept here (a bounded LRU), the
check asks again only where no check kept them (the blocks a decode wrote).

A row is keyed by a 128-bit chained digest of every token before it, so two contexts share a key only where
they are the same tokens (a collision: about 2^-64 for a billion rows)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

ROWS = 1 << 16
"""Rows kept, at most (~150 bytes each: ~10 MB): a few hundred checks of a hundred positions, the checks of the
last seconds at a replica's load."""

TopRow = tuple[int, float]
"""The target's top token at a position and its lead over the runner-up (nats)."""


def context_keys(ids: Sequence[int]) -> list[bytes]:
    """``keys[p]``: the key of the row at position ``p`` (its context ``ids[:p]``), for ``p`` in 0..len(ids)."""
    keys, h = [b""], b""
    for tok in ids:
        h = hashlib.blake2b(h + tok.to_bytes(4, "little", signed=True), digest_size=16).digest()
        keys.append(h)
    return keys


class CheckedRows:
    """The rows of the last ``size`` positions checked, by context key (``context_keys``)."""

    def __init__(self, size: int = ROWS) -> None:
        self.size = size
        self._rows: OrderedDict[bytes, TopRow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: bytes) -> TopRow | None:
        row = self._rows.get(key)
        if row is not None:
            self._rows.move_to_end(key)
        return row

    def clear(self) -> None:
        self._rows.clear()

    def put(self, key: bytes, row: TopRow) -> None:
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.size:
            self._rows.popitem(last=False)
