"""What a run of a plan gives the application: ``EdgeResult`` (immutable, one per run) and the
``ResultBuilder`` a run fills in as drafts, verdicts and the cloud's summary arrive."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coinfer import convert
from coinfer import types as t
from coinfer.edge.kinds import FallbackKind

if TYPE_CHECKING:
    from coinfer.edge.failures import CloudFailed


@dataclass(kw_only=True, frozen=True)
class EdgeResult:
    """What the application gets back: one immutable result per run of a plan (the pipeline fills a
    ``ResultBuilder`` while it runs; later layers add to a result with ``dataclasses.replace``)."""

    answer: str
    source: t.ResultSource
    valid: bool
    drafts: list[t.Draft] = field(default_factory=list)
    verdicts: dict[int, t.Verdict] = field(default_factory=dict)
    summary: t.Summary | None = None
    rounds: int = 0
    fallback_reason: str = ""
    fallback_kind: FallbackKind | None = None
    """The fallback's cause as data (``failure_kind``, or ``NO_CLOUD`` / ``CIRCUIT_OPEN`` when the
    cloud was skipped): what the breaker and the metrics decide on; ``fallback_reason`` is for people."""
    fallback_status: str = ""
    """The gRPC status name the failed cloud call ended with ("" when none did)."""
    timings: dict[str, float] = field(default_factory=dict)
    """ms: first_draft, drafting (all rounds), total; after an escalation also ``escalation`` (the
    split's own time; drafting and total then cover the edge attempt and the split)."""
    predicted: dict[str, float] = field(default_factory=dict)
    """The planner's predicted breakdown (ms) for the plan it chose: ``total_ms`` its expectation
    (auto's edge plan: ``attempt_ms`` plus ``escalation_ms``, the escalation's chance times its cost)."""
    plan_reason: str = ""
    task: str = ""
    """The task preset that ran ("" = open request)."""
    fields: dict = field(default_factory=dict)
    """Fields extracted from the answer."""
    refine_mode: t.RefineMode | None = None
    """How the cloud's refinement used the drafts; None: no refinement (the wire's "")."""
    replays: list[str] = field(default_factory=list)
    """Why each replay on another replica happened (a session that failed before its summary)."""
    finish_reason: t.FinishReason = t.FinishReason.STOP
    """``length`` when the answer hit its token budget (incomplete), ``repetition`` when the loop
    watch cut it, else ``stop``."""
    continued: dict[int, int] = field(default_factory=dict)
    """Drafts that continue streamed final text (a local answer after it): draft index -> that text's
    length. Such a draft's ``text`` begins with it; its ``num_tokens`` counts only what the edge wrote."""

    def written_drafts(self) -> list[t.Draft]:
        """The drafts as the edge wrote them: a continuation without the text it continued, so that each
        draft's text and ``num_tokens`` agree (what the planner learns bytes per token and lengths from)."""
        cut = self.continued
        return [dataclasses.replace(d, text=d.text[cut[d.index] :]) if d.index in cut else d for d in self.drafts]


@dataclass(kw_only=True)
class ResultBuilder:
    """An ``EdgeResult`` being filled in by one run of a plan (drafts, verdicts and the summary arrive as
    the run goes); ``freeze`` hands the result over. The same fields as ``EdgeResult``, mutable
    (tests/edge/test_result.py holds the two field lists equal)."""

    answer: str = ""
    source: t.ResultSource = t.ResultSource.EDGE_ONLY
    valid: bool = False
    drafts: list[t.Draft] = field(default_factory=list)
    verdicts: dict[int, t.Verdict] = field(default_factory=dict)
    summary: t.Summary | None = None
    rounds: int = 0
    fallback_reason: str = ""
    fallback_kind: FallbackKind | None = None
    fallback_status: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    plan_reason: str = ""
    task: str = ""
    fields: dict = field(default_factory=dict)
    refine_mode: t.RefineMode | None = None
    replays: list[str] = field(default_factory=list)
    finish_reason: t.FinishReason = t.FinishReason.STOP
    continued: dict[int, int] = field(default_factory=dict)

    def take(self, summary: t.Summary) -> None:
        """The cloud's answer: adopt its summary."""
        self.summary, self.answer, self.valid = summary, summary.answer, summary.answer_valid
        self.source = t.ResultSource.of(summary.source)
        # typed by the converter off the wire; a Summary built in-process may still hold strings
        self.fields = dict(summary.fields)
        self.refine_mode = convert.str_enum(t.RefineMode, summary.refine_mode, None, "refine_mode")
        self.finish_reason = convert.str_enum(
            t.FinishReason, summary.finish_reason, t.FinishReason.STOP, "finish_reason"
        )

    def fell_back(self, failed: CloudFailed) -> None:
        """The cloud failed: the answer is the edge's, and says why."""
        self.source, self.summary, self.refine_mode = t.ResultSource.EDGE_ONLY, None, None
        self.fallback_reason, self.fallback_kind, self.fallback_status = failed.reason, failed.kind, failed.status

    def continue_with(self, drafts: list[t.Draft], prefix: str) -> None:
        """``drafts`` continue ``prefix`` (streamed final text): noted in ``continued``."""
        if prefix:
            self.continued.update({d.index: len(prefix) for d in drafts})

    def freeze(self) -> EdgeResult:
        """The result, owning copies of what the run filled in."""
        return EdgeResult(**{f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(EdgeResult)})
