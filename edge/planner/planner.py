"""The planner: estimates -> profiles -> the cost model's expectations -> one draw -> a plan; measured
requests -> estimates.

The one exploration rule (docs/planner.md): Thompson sampling on the estimates' uncertainty. Per request,
each plan's latency is drawn from a normal around its measured mean latency for the task (the cost model's
expectation counting as ``MODEL_RUNS`` runs beside it, all there is for a plan never run: ``Planner._center``)
with the standard error of that measurement (``latency_ms.<plan>.<task>``), each plan's rule-valid rate
from its Beta posterior (``quality.<plan>.<task>``; the edge plan's chance of escalating is one minus its
draw); the plan fastest in the draw that meets ``quality_floor`` runs (``cost.pick``). A plan whose latency
has no spread yet (fewer than two runs' worth) draws minus infinity: it runs first, the likeliest-fast of
such first. An estimate not fed fades (``coinfer.estimator``), its standard error grows, and its draws
reach further: a plan left alone is tried again as surely as it is uncertain, and a plan measured well
and clearly slower almost never. Nothing counts runs or seconds besides.

Online updates (each plan that ran, with its own result and times):
  drafting      step_ms.<n>           (drafting - prompt * prefill) / longest draft's tokens
  every plan    latency_ms.<plan>.<task>: the run's own time (its cold start apart: the model adds it)
  split, cloud  refine_ttft_ms, refine_ms_per_token from the cloud's summary (its decode steps
                and generation time); decode_steps.<plan>.<task>, the answer's length in steps
  split         verify_ms = what the split took beyond drafting, refinement and the transfer model
  cloud         setup_ms = what the request took beyond generation, the transfer model and queue
  split, cloud  cloud_tokens.<plan>.<task>: the engine tokens the cloud reports the answer cost it
                (``Summary.cost``), reported by ``--explain``
  every plan    draft / answer sizes per task, quality.<plan>.<task> (rule-valid answers); a split
                also measures quality.edge (was any first-round draft rule-valid)
  escalation    auto's edge answer failed the rules and a split refined its drafts: two runs,
                observed apart. The edge attempt is an edge observation with the edge's own
                validity (so quality.edge, whose complement is the chance of escalating, learns
                from the edge's answers, never from the cloud's verdict on the split); the split is
                a split observation with ``escalated``: the cloud's speeds as any split, its
                outcomes (rounds, decode steps, quality) under ``*.escalated.<task>`` because its
                first round is known bad (kept out of the estimates of splits chosen up front)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from dataclasses import dataclass

from coinfer.edge.planner.cost import (
    CLOUD_PLANS,
    PLANS,
    Breakdown,
    Choice,
    CloudProfile,
    EdgeProfile,
    Escalation,
    NetProfile,
    RequestShape,
    drafting_ms,
    escalation_note,
    pick,
    predict,
    predict_all,
    predict_escalation,
)
from coinfer.edge.planner.estimates import Estimates
from coinfer.estimator import Decayed
from coinfer.types import ModelState, Plan

log = logging.getLogger(__name__)

ESCALATED = "escalated"
"""The estimates' name for an escalated split's outcomes (``rounds.escalated.<task>``)."""


@dataclass(frozen=True, kw_only=True)
class EdgeState:
    model_bytes: int
    state: ModelState
    loading_remaining_ms: float = 0.0
    gpu: bool = False
    fresh: bool = False
    """No request drafted on this session yet (always so when cold or loading)."""

    @property
    def first_run(self) -> bool:
        return self.fresh or self.state != ModelState.WARM


@dataclass(frozen=True)
class PromptSize:
    """A request's prompt: tokens (estimated from the measured bytes per token) and bytes."""

    tokens: int
    bytes: int


@dataclass(frozen=True)
class Draw:
    """One plan's values in this choice's draw: its latency (-inf: no spread yet) and rule-valid rate."""

    ms: float
    quality: float


MODEL_RUNS = 1.0
"""The cost model's expectation counts as this many runs of a plan beside its measured latency (``Planner._center``):
a convention (a prior worth one observation), not tuned."""


def latency_draw(center_ms: float, measured: Decayed | None, rng: random.Random) -> float:
    """The exploration rule's draw of one plan's latency: ``center_ms`` (``Planner._center``) plus a
    normal draw of the standard error of the plan's ``measured`` latency; -inf while that has no spread
    (fewer than two runs' worth: run it)."""
    se = None if measured is None else measured.stderr
    return -math.inf if se is None else center_ms + se * rng.gauss(0.0, 1.0)


class Planner:
    def __init__(self, est: Estimates, *, quality_floor: float = 0.0, rng: random.Random | None = None) -> None:
        """``rng``: the draws' source (seeded in tests)."""
        self.est = est
        self.quality_floor = quality_floor
        self.rng = rng or random.Random()

    @property
    def bytes_per_token(self) -> float:
        """Measured from drafts; 1 until then (no caveat: it only converts between the two sizes)."""
        return self.est.measured("bytes_per_token") or 1.0

    def prompt_size(self, prompt: str) -> PromptSize:
        nbytes = len(prompt.encode())
        return PromptSize(max(1, round(nbytes / self.bytes_per_token)), nbytes)

    # ---- profiles ------------------------------------------------------------------
    def edge_profile(self, s: EdgeState) -> EdgeProfile:
        e = self.est
        return EdgeProfile(
            model_bytes=s.model_bytes,
            disk_read_bps=e.get("disk_read_bps"),
            pcie_h2d_bps=e.get("pcie_h2d_bps") if s.gpu else None,
            session_ms=e.get("session_ms"),
            warmup_ms=e.get("warmup_ms"),
            prefill_ms_per_token=e.get("prefill_ms_per_token"),
            step_ms=e.step_ms(),
            state=s.state,
            loading_remaining_ms=s.loading_remaining_ms,
            first_run_ms=e.get("first_run_ms") if s.first_run else 0.0,
        )

    def net_profile(self) -> NetProfile:
        e = self.est
        return NetProfile(rtt_ms=e.get("rtt_ms"), up_bps=e.get("up_bps"), down_bps=e.get("down_bps"))

    def cloud_profile(self) -> CloudProfile:
        e = self.est
        return CloudProfile(
            queue_ms=e.get("queue_ms"),
            verify_ms=e.get("verify_ms"),
            refine_ttft_ms=e.get("refine_ttft_ms"),
            refine_ms_per_token=e.get("refine_ms_per_token"),
            setup_ms=e.get("setup_ms"),
        )

    def shape(self, *, task: str, size: PromptSize, n: int) -> RequestShape:
        e = self.est
        dt, at = e.get(f"draft_tokens.{task}"), e.get(f"answer_tokens.{task}")
        bpt = self.bytes_per_token
        return RequestShape(
            prompt_tokens=size.tokens,
            draft_tokens=round(dt),
            n_drafts=n,
            answer_tokens=round(at),
            prompt_bytes=size.bytes,
            draft_bytes=round(dt * bpt),
            answer_bytes=round(at * bpt),
            rounds=e.get(f"rounds.{task}"),
            split_steps=e.get(f"decode_steps.split.{task}"),
            cloud_steps=self._cloud_steps(task),
            # the cloud's reported engine tokens per answer; None until reported (never guessed)
            split_work=e.measured(f"cloud_tokens.split.{task}"),
            cloud_work=e.measured(f"cloud_tokens.cloud.{task}"),
        )

    def _cloud_steps(self, task: str) -> float:
        """The cloud plan's decode steps for ``task``: measured, else as long as the answers the
        cloud wrote for the task in splits (``answer_tokens``), else the default. Without this,
        a plan auto never ran kept its conservative default (128 steps: 786 ms predicted against
        150 ms measured for a word problem) and auto never chose it, so never learned otherwise."""
        e = self.est
        key = f"decode_steps.cloud.{task}"
        if not e.has(key) and e.has(f"answer_tokens.{task}"):
            return e.get(f"answer_tokens.{task}")
        return e.get(key)

    def escalation(self, task: str, shape: RequestShape, quality: float | None = None) -> Escalation:
        """Auto's edge plan escalating a rule-failing answer: the split's shape and quality from
        escalations' own history (``quality``: a draw in its place)."""
        e = self.est
        work = e.measured(f"cloud_tokens.escalated.{task}")
        x = dataclasses.replace(
            shape,
            rounds=e.get(f"rounds.escalated.{task}"),
            split_steps=e.get(f"decode_steps.escalated.{task}"),
            # an escalation's own reports, else a split's: the same session, its first round known bad
            split_work=work if work is not None else shape.split_work,
        )
        q = e.get(f"quality.escalated.{task}") if quality is None else quality
        return Escalation(shape=x, quality=q)

    def local_ms(self, *, task: str, size: PromptSize, n: int, edge: EdgeState) -> float:
        """Predicted time to draft this request locally on a warm edge model: how long before a
        cloud plan's deadline the edge starts its local answer (``EdgePipeline``'s hedge)."""
        try:
            warm = self.edge_profile(dataclasses.replace(edge, state=ModelState.WARM))
            return drafting_ms(warm, self.shape(task=task, size=size, n=n))
        except (ValueError, ZeroDivisionError):
            return 0.0

    def quality(self, task: str) -> dict[Plan, float]:
        return {p: self.est.get(f"quality.{p}.{task}") for p in PLANS}

    # ---- the choice ----------------------------------------------------------------
    def choose(self, *, task: str, size: PromptSize, n: int, edge: EdgeState, cloud_available: bool) -> Choice:
        """Auto's choice (the module docstring's rule). With a cloud, the edge plan is predicted with its
        escalation (the service sends a rule-failing edge answer to a split while the cloud is healthy)."""
        # "default used" caveats are re-derived per choice; probe / refusal caveats stay
        self.est.forget("not measured yet")
        try:
            means, draws = self._predicted(task=task, size=size, n=n, edge=edge, cloud_available=cloud_available)
        except (ValueError, ZeroDivisionError) as exc:  # never let the planner fail a request
            self.est.note(f"cost model failed ({exc}); falling back to split", key="cost model failed")
            return Choice(
                plan=Plan.SPLIT if cloud_available else Plan.EDGE,
                breakdowns={},
                reason="fallback: cost model failed",
                notes=tuple(self.est.notes),
            )
        order = sorted(draws, key=lambda p: (draws[p].ms, means[p].total_ms))
        best, met = pick(order, {p: d.quality for p, d in draws.items()}, self.quality_floor)
        return Choice(
            plan=best, breakdowns=means, reason=self._reason(task, best, met, means, draws), notes=tuple(self.est.notes)
        )

    def _predicted(
        self, *, task: str, size: PromptSize, n: int, edge: EdgeState, cloud_available: bool
    ) -> tuple[dict[Plan, Breakdown], dict[Plan, Draw]]:
        """Every plan's expected breakdown, and its draw: the breakdown again at the rule-valid rates drawn
        (the edge's escalation with them), its latency drawn around that."""
        shape = self.shape(task=task, size=size, n=n)
        profile = self.edge_profile(edge)
        net, cloud = (self.net_profile(), self.cloud_profile()) if cloud_available else (None, None)
        esc = self.escalation(task, shape) if cloud_available else None
        means = predict_all(shape, profile, net, cloud, self.quality(task), esc)
        q = {p: self._quality_draw(f"quality.{p}.{task}") for p in means}
        esc_q = self.escalation(task, shape, self._quality_draw(f"quality.{ESCALATED}.{task}")) if esc else None
        drawn = predict_all(shape, profile, net, cloud, q, esc_q)
        return means, {
            p: Draw(self._latency_draw(p, task, self._center(p, task, drawn[p])), drawn[p].quality) for p in means
        }

    def _center(self, plan: Plan, task: str, b: Breakdown) -> float:
        """Where a plan's latency draw centres: its own measured mean latency for the task, the cost model's
        expectation (``b``, at the draw's rates) counting as ``MODEL_RUNS`` runs beside it; the cold start and
        an escalation's share are the model's (the measured latency is the run's own time). A plan never run, or
        left alone until its evidence faded, is the model's. Under load the measurement is what moves: the
        model prices load by the cloud's decode speed, which slows a plan that decodes most, while a split's
        checks (prefill, engine requests) slow it more (words, 2026-12-06: split 162 engine tokens an answer
        against the cloud plan's 51, auto on split to 0.84 s p50 where the cloud plan held 0.43)."""
        own = b.attempt_ms - b.cold_start_ms
        d = self.est.estimate(f"latency_ms.{plan}.{task}")
        if d is not None and d.weight > 0:
            own = (d.weight * d.mean + MODEL_RUNS * own) / (d.weight + MODEL_RUNS)
        return b.cold_start_ms + own + b.escalation_ms

    def _latency_draw(self, plan: Plan, task: str, center_ms: float) -> float:
        return latency_draw(center_ms, self.est.estimate(f"latency_ms.{plan}.{task}"), self.rng)

    def _quality_draw(self, key: str) -> float:
        """A draw of a rule-valid rate from its Beta posterior (uniform before any answer)."""
        a, b = (self.est.estimate(key) or Decayed()).beta
        return self.rng.betavariate(a, b)

    def _reason(self, task: str, best: Plan, met: bool, means: dict[Plan, Breakdown], draws: dict[Plan, Draw]) -> str:
        """``--explain``'s why: the plan, its draw against its expectation and the estimate behind it."""
        b, d = means[best], draws[best]
        if len(means) == 1:
            return f"{best}: the only plan without a reachable cloud; predicted {b.total_ms:.0f} ms"
        others = "; then " + ", ".join(self._said(task, p, means[p], draws[p]) for p in means if p != best)
        if not met:
            return (
                f"{best}: no plan reaches the quality floor {self.quality_floor:.2f} in this draw; highest "
                f"quality ({d.quality:.2f}, expected {b.quality:.2f})" + others
            )
        if d.ms == -math.inf:
            return (
                f"explore: {best}'s latency for {task!r} has no spread yet ({self._latency(best, task)}); "
                f"predicted {b.total_ms:.0f} ms{escalation_note(b)}" + others
            )
        return (
            f"{best}: fastest in this draw, {self._said(task, best, b, d)}{escalation_note(b)}, quality "
            f"{d.quality:.2f} (expected {b.quality:.2f}) >= floor {self.quality_floor:.2f}" + others
        )

    def _said(self, task: str, plan: Plan, b: Breakdown, d: Draw) -> str:
        if d.ms == -math.inf:
            return f"{plan} {b.total_ms:.0f} ms predicted (no spread yet)"
        return f"{plan} drew {d.ms:.0f} ms (predicted {b.total_ms:.0f}, {self._latency(plan, task)})"

    def _latency(self, plan: Plan, task: str) -> str:
        """The latency estimate behind a draw, in words: its standard error and the weight it rests on."""
        d = self.est.estimate(f"latency_ms.{plan}.{task}")
        if d is None:
            return "never run"
        se = d.stderr
        spread = "no spread" if se is None else f"+-{se:.0f} ms"
        return f"{spread} over {d.weight:.2g} runs' weight, measured mean {d.mean:.0f} ms"

    # ---- online updates ------------------------------------------------------------
    def observe(
        self,
        *,
        plan: Plan,
        task: str,
        size: PromptSize,
        n: int,
        result,
        edge_was: EdgeState,
        escalated: bool = False,
    ) -> None:
        """Fold one plan's run (its own result and stage times) into the estimates, and persist them (off the
        event loop). ``escalated``: the split that followed auto's rule-failing edge answer, whose drafts the
        edge attempt's own observation already measured."""
        e = self.est
        if not escalated:
            self._observe_drafts(task, size, n, result, edge_was)
        if result.answer and not result.fallback_reason:  # a fallback's answer is a local draft
            e.observe(f"answer_tokens.{task}", max(1.0, len(result.answer.encode()) / self.bytes_per_token))
        if not result.fallback_reason:
            self._observe_quality(plan, task, n, result, escalated)
            if not escalated and "total" in result.timings:  # the plan's own time: what its draws spread around
                e.observe(f"latency_ms.{plan}.{task}", result.timings["total"])
        if result.summary is not None and not result.fallback_reason and plan in CLOUD_PLANS:
            self._observe_cloud(plan, task, size, n, result, edge_was, escalated)
        e.save()

    def _observe_drafts(self, task: str, size: PromptSize, n: int, result, edge_was: EdgeState) -> None:
        e = self.est
        t = result.timings
        drafts = result.drafts
        if not drafts:
            return
        longest = max(d.num_tokens for d in drafts)
        if not longest:
            return
        e.observe(f"draft_tokens.{task}", float(longest))
        nbytes = sum(len(d.text.encode()) for d in drafts)
        ntok = sum(d.num_tokens for d in drafts)
        if ntok:
            e.observe("bytes_per_token", max(nbytes / ntok, 0.25))
        # one round only: a retry round drafts at another batch size (the cloud's advice)
        if "drafting" not in t or result.rounds > 1:
            return
        if not edge_was.first_run:
            step = (t["drafting"] - size.tokens * e.get("prefill_ms_per_token")) / longest
            if step > 0:
                e.observe(f"step_ms.{n}", step)
        else:  # the first request on a fresh session: what it drafted beyond a warm one
            warm_state = EdgeState(model_bytes=edge_was.model_bytes, state=ModelState.WARM, gpu=edge_was.gpu)
            warm = drafting_ms(
                self.edge_profile(warm_state),
                dataclasses.replace(self.shape(task=task, size=size, n=n), draft_tokens=longest),
            )
            e.observe("first_run_ms", max(0.0, t["drafting"] - warm))

    def _observe_quality(self, plan: Plan, task: str, n: int, result, escalated: bool) -> None:
        e = self.est
        e.observe(f"quality.{ESCALATED if escalated else plan}.{task}", 1.0 if result.valid else 0.0)
        if plan == Plan.SPLIT and not escalated:
            # what edge-only would have answered: valid iff a first-round draft passed the rules
            # (the cloud checks the same rule set; the judge verifier may also reject) — so a
            # floor that keeps requests off the edge plan does not freeze its quality estimate.
            # Not for an escalation: its edge attempt was observed with the edge's own verdict.
            first = [v for i, v in result.verdicts.items() if i < n]
            if first:
                e.observe(f"quality.edge.{task}", 1.0 if any(v.valid for v in first) else 0.0)

    def _observe_cloud(
        self, plan: Plan, task: str, size: PromptSize, n: int, result, edge_was: EdgeState, escalated: bool
    ) -> None:
        e = self.est
        t, tm = result.timings, result.summary.timings
        kind = ESCALATED if escalated else plan
        # the cloud's generation: its speed apart from this answer's length
        # 0 steps is an answer too: the cloud accepted a verified draft as it stands
        e.observe(f"decode_steps.{kind}.{task}", float(tm.decode_steps))
        if result.summary.cost is not None:  # what the answer cost the cloud, as the cloud counts it
            e.observe(f"cloud_tokens.{kind}.{task}", float(result.summary.cost.work_tokens))
        if tm.decode_steps > 0 and tm.refine_ttft_ms > 0:
            # net of the queue wait the Status RPC reported: the cost model adds that itself
            e.observe("refine_ttft_ms", max(0.0, tm.refine_ttft_ms - e.get("queue_ms")))
            if tm.refine_ms > tm.refine_ttft_ms:
                e.observe("refine_ms_per_token", (tm.refine_ms - tm.refine_ttft_ms) / tm.decode_steps)
        # the cost model's own transfer term, with the rounds this request really took
        shape = dataclasses.replace(self.shape(task=task, size=size, n=n), rounds=float(max(1, result.rounds)))
        profiles = (self.edge_profile(edge_was), self.net_profile(), self.cloud_profile())
        if escalated:
            transfer = predict_escalation(shape, *profiles, 0.0).transfer_ms
        else:
            transfer = predict(plan, shape, *profiles, 0.0).transfer_ms
        rest = t.get("total", 0.0) - tm.refine_ms - transfer - e.get("queue_ms")
        if plan == Plan.CLOUD:
            e.observe("setup_ms", max(0.0, rest))
            return
        e.observe(f"rounds.{ESCALATED}.{task}" if escalated else f"rounds.{task}", shape.rounds)
        if edge_was.state == ModelState.WARM or escalated:  # an escalation's edge is warm: it just drafted
            e.observe("verify_ms", max(0.0, (rest - t.get("drafting", 0.0)) / shape.rounds))
