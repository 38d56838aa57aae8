"""A judged draft, and the ranking of the valid ones (pure: numbers in, order out; docs/design.md §3.1)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from coinfer import types as t
from coinfer.cloud.policy import answer_agreement, load_scaled_g, rank_scores
from coinfer.tasks import Parsed, Task

MS_PER_S = 1e3


@dataclass(kw_only=True)
class Judged:
    """A draft and its verdict (``parsed``: what the rules extracted from it)."""

    draft: t.Draft
    verdict: t.Verdict
    support: int = 1
    """1 + the structural duplicates merged into it (0 for a duplicate itself)."""
    parsed: Parsed | None = None


Ranked = list[tuple[Judged, float, float]]
"""Valid drafts, best first: (judged, rank score, agreement on the extracted answer)."""


def rank(judged: Iterable[Judged], task: Task, weights: tuple[float, float, float], load: float) -> Ranked:
    """Valid drafts, best first, by ``a*score + b*agreement - g*latency`` (``weights``: a, b, g; the
    latency weight raised with engine ``load``). A draft that ended by itself comes before one cut at
    its budget, whatever their scores (as the edge's local choice): a truncated draft's likelihood is
    that of an answer that never reached its end (SmolLM2: a French ramble cut at 64 tokens outranked
    "The capital of France is Paris.")."""
    cands = [j for j in judged if j.verdict.valid and not j.verdict.duplicate_of]
    if not cands:
        return []
    a, b, g = weights
    agree = answer_agreement([task.answer_key(j.parsed) for j in cands], [j.support for j in cands])
    ranks = rank_scores(
        [j.verdict.score for j in cands],
        [j.verdict.verify_ms / MS_PER_S for j in cands],
        a,
        b,
        load_scaled_g(g, load),
        agree=agree,
    )
    return sorted(zip(cands, ranks, agree), key=lambda x: (x[0].draft.truncated, -x[1]))
