"""The state of one co-inference session, shared by its parts: verification and ranking
(``coinfer.cloud.judging``), the answer paths (``coinfer.cloud.answering``) and the driver with its
stream (``coinfer.cloud.session``)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from coinfer import types as t
from coinfer.cloud.config import CloudConfig
from coinfer.cloud.engine import TargetEngine
from coinfer.cloud.policy import RoundOdds
from coinfer.rules import RuleSet
from coinfer.tasks import Parsed, Task


@dataclass
class Judged:
    """A draft and its verdict (``parsed``: what the rules extracted from it)."""

    draft: t.Draft
    verdict: t.Verdict
    support: int = 1  # 1 + structural duplicates merged into it
    parsed: Parsed | None = None


Ranked = list[tuple[Judged, float, float]]
"""Valid drafts, best first: (judged, rank score, agreement on the extracted answer)."""


@dataclass
class SessionState:
    """What one session knows: its request, its engine, the drafts judged so far and what was streamed."""

    cfg: CloudConfig
    engine: TargetEngine
    req: t.OpenRequest
    task: Task
    spec: dict
    rules: RuleSet
    recommended_drafts: int
    deadline_s: float
    t0: float = field(default_factory=time.perf_counter)
    judged: dict[int, Judged] = field(default_factory=dict)
    attempt: int = 0
    seen: set[int] = field(default_factory=set)
    # engine request ids must be unique across sessions even when two edges reuse a request_id
    key: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    weights: tuple[float, float, float] | None = None
    """Scheduler weights (a, b, g) in force; None = the configured ones."""
    round_odds: RoundOdds | None = None
    """The service's record of how often a round of drafts holds a valid one (None: retry as configured)."""
    load: float = 0.0
    """Engine load at open: raises the latency weight."""
    outcome: list[tuple[float, float, float, float]] = field(default_factory=list)
    """(score, agreement, latency_s, label) per ranked draft once finished: the learner's input."""
    min_logprob: dict[int, float] = field(default_factory=dict)
    """Per verified draft: its least likely token's logprob under the target (likelihood verifier)."""
    mean_lp: dict[int, float] = field(default_factory=dict)
    """Per verified draft: its mean per-token logprob under the target (likelihood verifier)."""
    shown: str = ""
    """The answer text streamed so far (since the last reset): an answer other than it withdraws it first."""

    @property
    def rules_decide(self) -> bool:
        """The rules alone judge a draft (``PolicyConfig.rules_decide``): no LLM verifier, no refinement."""
        return self.cfg.policy.rules_decide and self.rules.exact
