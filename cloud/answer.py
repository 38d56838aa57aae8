"""What a session answered (``Answer``), and the pure text work around the cloud's answers: the step
prefix the target continues, the finish reason, and the two ways a refinement copies its prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coinfer import types as t
from coinfer.cloud.ranking import Judged
from coinfer.tasks import Parsed

SCAFFOLDING_MIN_CHARS = 12
"""A line of the refinement template this long, found in an answer, was copied from the prompt: shorter
lines ("Answer:") are words an answer may well use itself."""


@dataclass(kw_only=True)
class Answer:
    """How the session answered: what the Summary reports (cloud work in ``steps`` decode steps and
    ``generated`` tokens, a batch of candidates counting each)."""

    text: str
    source: t.AnswerSource
    valid: bool
    parsed: Parsed | None
    chosen: list[Judged] = field(default_factory=list)
    """The drafts the answer was built from (refinement context, or the draft returned)."""
    mode: t.RefineMode
    finish: t.FinishReason
    note: str
    """Why this answer: the Summary's trace ends with it."""
    ttft_ms: float = 0.0
    steps: int = 0
    generated: int = 0
    accepted: int = 0
    """Draft tokens the target took where they were its own (exact verification): written, not decoded."""


def draft_answer(best: Judged, mode: t.RefineMode, note: str) -> Answer:
    """The verified draft ``best``, as it stands, as the answer."""
    return Answer(
        text=best.draft.text,
        source=t.AnswerSource.DRAFT,
        valid=True,
        parsed=best.parsed,
        chosen=[best],
        mode=mode,
        finish=t.FinishReason.LENGTH if best.draft.truncated else t.FinishReason.STOP,
        note=note,
    )


def join_steps(steps: list[str]) -> str:
    """Steps as an answer prefix the target continues: ``"a; b;"`` (empty for none). No trailing
    space: byte-level BPEs merge a space into the next word (``" AC"`` is one token), so a prefix
    ending in a lone space token is text the target never saw, and it continued select's steps
    without their ids (``"AB 11>10; 14>10; ..."``)."""
    return "; ".join(steps) + ";" if steps else ""


def finish_reason(engine_reason: str | None, current: t.FinishReason = t.FinishReason.STOP) -> t.FinishReason:
    """The finish reason of a generation from the engine's (vLLM: "stop", "length", or None while it
    runs): "length" when it hit its budget, ``current`` while it runs."""
    if engine_reason is None:
        return current
    return t.FinishReason.LENGTH if engine_reason == t.FinishReason.LENGTH else t.FinishReason.STOP


def scaffolding_error(text: str, template: str) -> str:
    """Why ``text`` copied the refinement template instead of answering: it contains one of the template's
    own lines (of >= ``SCAFFOLDING_MIN_CHARS`` chars, between placeholders); "" when it does not."""
    for part in template.replace("{question}", "\0").replace("{candidates}", "\0").split("\0"):
        for line in part.split("\n"):
            if len(line.strip()) >= SCAFFOLDING_MIN_CHARS and line.strip() in text:
                return f"scaffolding: the refinement copies the prompt's {line.strip()!r}"
    return ""


def strip_candidate_label(text: str, candidate_format: str, n: int) -> str:
    """``text`` without a leading candidate label ("(1) ") copied from the refinement prompt."""
    head = candidate_format.split("{text}", 1)[0]
    stripped = text.lstrip()
    for i in range(1, n + 1):
        label = head.format(n=i)
        if label.strip() and stripped.startswith(label):
            return stripped[len(label) :]
    return text
