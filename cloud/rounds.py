"""A session's rounds of drafts (pure): which drafts it takes (``Rounds``: the limits per session and per
round), and what it advises when a round held no valid draft (``retry_advice``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from coinfer import types as t
from coinfer.cloud.config import Limits
from coinfer.errors import InvalidArgument, ResourceExhausted, field_of
from coinfer.rules import RuleSet

# Each retry round explores more than the last: hotter, more diverse, a few more drafts. The steps are
# per round (attempt 1, 2, ...); the caps keep a late round's drafts from turning to noise.
TEMPERATURE_STEP = 0.3
MAX_TEMPERATURE = 1.5
PRESENCE_PENALTY_STEP = 0.2
FREQUENCY_PENALTY_STEP = 0.1
MAX_PENALTY = 2.0
"""OpenAI's bound on presence and frequency penalties (``SamplingParams`` refuses more)."""
EXTRA_DRAFTS_PER_ROUND = 2


def request_kind(req: t.OpenRequest, rules: RuleSet) -> tuple[str, str, tuple[str, ...]]:
    """What rounds of drafts are counted by (``RoundOdds``): the draft model that writes them (the edge's
    ``draft_model``: one edge's weak draft model must not leave another's valid drafts unscored), the task
    preset and the kinds of the rules in force (``RuleSet.kinds``, a closed set: never the names a client gives
    its rules, which would make a kind per request)."""
    return req.draft_model, req.task, rules.kinds


@dataclass(kw_only=True)
class Rounds:
    """The drafts a session has taken, by round, within ``limits``."""

    limits: Limits
    seen: set[int] = field(default_factory=set)
    """Indices of every draft taken (all rounds): an index is sent once."""
    in_round: int = 0
    """Drafts taken in the current round."""
    attempt: int = 0
    """Retry rounds advised so far."""

    @property
    def drafts_left(self) -> int:
        """Drafts the session may still take (``Limits.max_drafts``)."""
        return self.limits.max_drafts - len(self.seen)

    def take(self, d: t.Draft) -> None:
        """Take draft ``d``; raises for a repeated index or one over the limits."""
        lim = self.limits
        if d.index in self.seen:
            raise InvalidArgument(f"draft.index: {d.index} was already sent")
        if len(d.text) > lim.max_draft_chars:
            raise ResourceExhausted(f"draft.text: {len(d.text)} chars > limit {lim.max_draft_chars}")
        if len(self.seen) >= lim.max_drafts:
            raise ResourceExhausted(f"draft: more than {lim.max_drafts} drafts in one session")
        self.seen.add(d.index)
        self.in_round += 1

    def next_round(self) -> None:
        """A retry round begins (its drafts are counted from here)."""
        self.attempt += 1

    def close(self, count: int) -> None:
        """End the round the edge says held ``count`` drafts; raises where it sent another number."""
        if count != self.in_round:
            raise InvalidArgument(f"done.count: {count} but {self.in_round} drafts were sent this round")
        self.in_round = 0


def retry_advice(*, verdicts: Iterable[t.Verdict], attempt: int, drafts_left: int, recommended: int) -> t.RetryAdvice:
    """Advice for retry round ``attempt`` (1, 2, ...): why the drafts failed (the fields their errors name,
    most common first), sampling that explores more, and a few more drafts (at most ``drafts_left``)."""
    errors: dict[str, int] = {}
    for v in verdicts:
        if not v.valid:
            code = field_of(v.error)
            errors[code] = errors.get(code, 0) + 1
    reason = ", ".join(f"{k} x{n}" for k, n in sorted(errors.items(), key=lambda kv: -kv[1])) or "no drafts"
    base = t.SamplingParams()
    sampling = t.SamplingParams(
        temperature=min(MAX_TEMPERATURE, base.temperature + TEMPERATURE_STEP * attempt),
        top_p=base.top_p,
        presence_penalty=min(MAX_PENALTY, base.presence_penalty + PRESENCE_PENALTY_STEP * attempt),
        frequency_penalty=min(MAX_PENALTY, base.frequency_penalty + FREQUENCY_PENALTY_STEP * attempt),
        max_new_tokens=base.max_new_tokens,
    )
    n = min(drafts_left, recommended + EXTRA_DRAFTS_PER_ROUND * attempt)
    return t.RetryAdvice(attempt=attempt, num_drafts=n, sampling=sampling, reason=reason)
