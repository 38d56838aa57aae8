"""The Summary a session ends on, from what was judged and how it answered (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from coinfer import types as t
from coinfer.cloud.answer import Answer
from coinfer.cloud.ranking import Judged, Ranked


def trace(judged: Iterable[Judged], note: str) -> str:
    """The session's thinking trace: each draft's verdict, then why the answer is what it is."""
    verdicts = "; ".join(
        f"Draft#{j.draft.index} "
        + (
            f"scored {j.verdict.score:.2f}, passed {','.join(j.verdict.rules_passed)}"
            + (f" once repaired (as written: {j.verdict.repaired})" if j.verdict.repaired else "")
            if j.verdict.valid
            else f"failed {j.verdict.failed_rule}: {j.verdict.error}"
        )
        for j in judged
    )
    return f"[THINKING_TRACE: {verdicts} | {note}]"


def summary(
    *,
    req: t.OpenRequest,
    judged: dict[int, Judged],
    ranked: Ranked,
    answer: Answer,
    timings: t.Timings,
    recommended_drafts: int,
    prompt_tokens: int,
    answer_tokens: int,
) -> t.Summary:
    """The Summary of ``answer`` (``judged``: every draft's verdict, by index; ``ranked``: the valid
    ones' ranking)."""
    rank_of = {j.draft.index: r for j, r, _ in ranked}
    scores = [
        t.DraftScore(draft_index=i, valid=j.verdict.valid, score=j.verdict.score, rank_score=rank_of.get(i, 0.0))
        for i, j in sorted(judged.items())
    ]
    a = answer
    return t.Summary(
        answer=a.text,
        source=a.source,
        chosen_drafts=[j.draft.index for j in a.chosen],
        scores=scores,
        timings=timings,
        trace=trace(judged.values(), a.note),
        answer_valid=a.valid,
        recommended_drafts=recommended_drafts,
        request_id=req.request_id,
        refine_mode=a.mode,
        fields=dict(a.parsed.fields) if a.parsed is not None and a.parsed.ok else {},
        prompt_tokens=prompt_tokens,
        answer_tokens=answer_tokens,
        finish_reason=a.finish,
    )
