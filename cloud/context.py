"""What one session was asked and what it answers with: the request, its task and rules, the config and
the engine. Fixed when the session opens and read by every part of it (``Judge``, ``Answerer``,
``Session``); nothing here changes while the session runs, so the parts share it without sharing state.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field

from coinfer import types as t
from coinfer.cloud.config import CloudConfig, PolicyConfig
from coinfer.cloud.engine import GenParams, TargetEngine
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN, Task

KEY_CHARS = 12
"""Hex characters of a session's engine key: unique enough across the sessions one engine serves."""


def _new_key() -> str:
    return uuid.uuid4().hex[:KEY_CHARS]


@dataclass(frozen=True, kw_only=True)
class SessionContext:
    """One session's request and the means to answer it (read-only)."""

    cfg: CloudConfig
    engine: TargetEngine
    req: t.OpenRequest
    task: Task
    spec: dict
    rules: RuleSet
    key: str = field(default_factory=_new_key)
    """Prefix of the session's engine request ids: unique across sessions even when two edges reuse a
    request_id (vLLM refuses a second request under an id still running)."""

    @property
    def policy(self) -> PolicyConfig:
        return self.cfg.policy

    def request_id(self, tag: str) -> str:
        """The engine request id of this session's request ``tag`` ("v3": draft 3's verification)."""
        return f"{self.key}-{tag}"

    @functools.cached_property
    def prompt_text(self) -> str:
        """The conversation rendered with the target's chat template (computed once)."""
        return self.engine.render(self.req.conversation)

    @property
    def rules_decide(self) -> bool:
        """The rules alone judge a draft: a preset's own checkers, no client rule (``RuleSet.exact``), grade an
        answer exactly, so a draft that passes them is right -- no LLM verifier is asked, and the best such draft
        is the answer as is (no refinement, no continuation). The verifier's prefill per draft and the
        refinement were most of what a split answer cost the cloud: arith's split capacity went from 0 (the
        first rate missed) to >= 30.4/s (docs/measurements.md, "Capacity of one cloud replica against plain
        vLLM", runs A and B; the switch that kept the old scoring is gone)."""
        return self.rules.exact

    @property
    def repairs(self) -> bool:
        """A draft that fails the rules is checked again repaired (``PolicyConfig.repair_drafts``): where exact
        rules decide, which then vouch for text the draft model did not write; and an open request's
        equations under its ``arithmetic`` rule (``RuleSet.repairs_equations``), which the LLM verifier
        then judges as any draft (held-out word problems: most drafts' only mistake is a computed value)."""
        return self.policy.repair_drafts and (self.rules_decide or self.rules.repairs_equations)

    @property
    def own_over_candidates(self) -> bool:
        """Where the best draft is not taken as is, the cloud answers itself, checked step by step, rather than
        refine from candidates: an open request under the ``arithmetic`` rule whose cloud answer streams checked
        step by step (an extraction marker, or none: ``RuleSet.streams_steps``). The drafts' work is already in
        the repair of their computed values (``repairs``); what is left against them is the target's doubt, and
        the candidates' prompt cost the cloud ~4x its own answer (docs/measurements.md, "Word problems: drafts
        repaired, doubted drafts answered by the cloud's own checked answer": 48 held-out word problems, 48
        right either way, 90.5 engine tokens per answer against 119 with candidates). Where the own answer
        fails, the best valid draft answers (``Answerer``): never worse than it."""
        return self.rules.repairs_equations and self.rules.streams_steps

    @property
    def free_text(self) -> bool:
        """An open request with nothing to extract: a draft's answer is its whole text, which no other draft
        has to agree with (``Answerer.stands_alone``)."""
        return self.task is OPEN and self.req.extraction.kind in ("", "none")

    @property
    def exact(self) -> bool:
        """An open request answered by exact verification (``PolicyConfig.verifier`` "exact"): the answer is the
        target's own, taking the drafts' tokens where they are the ones it writes (``coinfer.cloud.speculation``).
        Not where the rules decide: a draft they pass is the answer."""
        return self.task is OPEN and self.policy.verifier == t.VerifierKind.EXACT and not self.rules_decide

    @property
    def thresholded(self) -> bool:
        """The likelihood threshold judges open requests; a built-in preset's checkers are exact."""
        return self.task is OPEN

    def params(self, max_tokens: int) -> GenParams:
        """The request's sampling (temperature, top_p, penalties, seed, stop), else the policy's."""
        sp = self.req.refine
        if sp is None:
            return GenParams(max_tokens=max_tokens, temperature=self.policy.refine_temperature)
        return GenParams(
            max_tokens=min(max_tokens, sp.max_new_tokens),
            temperature=sp.temperature,
            top_p=sp.top_p,
            presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty,
            seed=sp.seed,
            stop=sp.stop,
        )

    @property
    def answer_budget(self) -> int:
        """The tokens this request gives the cloud's answer: the policy's, or less when the request asks."""
        return self.params(self.policy.refine_max_tokens).max_tokens
