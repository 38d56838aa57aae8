"""Latency and quality model of the three plans. Pure and typed: numbers in, numbers out.

For a request of ``P`` prompt tokens, ``n`` drafts of ``D`` tokens each, an answer of ``A``
tokens (bytes: ``Bp`` prompt, ``Bd`` one draft, ``Ba`` answer) and ``S_plan`` target decode
steps (what the cloud generates for that plan: a refinement after drafts, or an answer of
its own plus, when that fails the rules, the longest of a batch of candidates):

    cold start   C = 0                                             edge model warm
                   remaining load time + first run                 loading
                   M/disk_bw + M/pcie_bw + session + warm-up       cold (pcie term only with a GPU)
                   + first run                                     first run: what the first request on
                                                                   a fresh session drafts slower (learnt)
    drafting     E = P * prefill_ms_per_token + D * step_ms(n)     step_ms(n): one decode step at batch n
    transfer     split: RTT + Bp/up + Bd/up + Ba/down              drafts stream while later ones are
                                                                   written; only the last is on the path
                 cloud: RTT + Bp/up + Ba/down
    generation   G_plan = ttft + S_plan * ms_per_token             the cloud's speed (load-dependent,
                                                                   tracked fast) apart from the answer's
                                                                   length (a task's average, tracked slow)
    cloud        split: queue + verify_last + G_split
                 cloud: queue + setup + G_cloud                    setup: session work outside generation
    rounds       R = expected draft rounds of a split (history): a round with no valid draft
                 costs another drafting pass plus the advice's trip: (R - 1) * (E + RTT + verify)

    edge  = C + E
    split = C + R * E + (R - 1) * (RTT + verify) + T_split + cloud_split
    cloud = T_cloud + cloud_cloud                                  no edge model needed: the way to
                                                                   serve a request while the edge warms
Escalation (auto only, a reachable cloud): an edge answer that fails the rules goes to a split
with the drafts already written. With ``q_e`` the edge answer's rule-pass rate (history per task),
``p = 1 - q_e`` is the chance of escalating; the escalated split has its own history (``R_x``
rounds, ``S_x`` decode steps, quality ``q_x``: its first round is known bad, so it retries or the
cloud answers alone more often than a split chosen up front):

    X     = (R_x - 1) * E + R_x * RTT + (Bp + n * Bd)/up + Ba/down   all n drafts are sent at once
            + queue + R_x * verify + G_x                             and the edge is warm by then
    edge under auto = C + E + p * X,   quality = q_e + p * q_x       an edge answer is returned only
                                                                     when it passed the rules
Measured on 120 held-out requests before this term existed: auto chose the edge for all 120,
98 escalated, and their median latency was 652 ms against a predicted 83 ms (8.0x).
All terms are expectations: rounds and decode steps average over a task's problems, so a
prediction is the mean latency of a plan, not the latency of one hard or easy problem.
Objective: the fastest plan whose expected quality (history of rule-valid answers per task and
plan) reaches ``quality_floor``; if none does, the plan of highest expected quality (``pick``). A floor
rather than a weighted sum because the price of a wrong answer in milliseconds is not
something an operator can state; "at least this good, then fastest" is. The planner applies the same
rule to values drawn around these expectations (``coinfer.edge.planner.planner``: its one exploration
rule); ``choose`` applies it to the expectations themselves.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from coinfer.types import ModelState, Plan

PLANS = tuple(Plan)
CLOUD_PLANS = (Plan.SPLIT, Plan.CLOUD)


@dataclass(frozen=True, kw_only=True)
class EdgeProfile:
    model_bytes: int
    disk_read_bps: float
    """Bytes/s reading the model file from disk (page cache dropped)."""
    pcie_h2d_bps: float | None
    """Bytes/s host -> device; None on a CPU-only box (no copy)."""
    session_ms: float
    warmup_ms: float
    prefill_ms_per_token: float
    step_ms: dict[int, float]
    """Decode step time at batch size n (measured at a few n; others interpolated)."""
    state: ModelState = ModelState.WARM
    loading_remaining_ms: float = 0.0
    first_run_ms: float = 0.0
    """Extra drafting time of the first request on a fresh session (allocation, thread start)."""

    def step(self, n: int) -> float:
        """Step time at batch ``n``: linear interpolation between measured sizes, extrapolated flat-slope."""
        pts = sorted(self.step_ms.items())
        if not pts:
            raise ValueError("step_ms: no measurements")
        if n <= pts[0][0]:
            return pts[0][1]
        for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
            if n <= n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        (n0, t0), (n1, t1) = (pts[-2], pts[-1]) if len(pts) > 1 else (pts[-1], pts[-1])
        slope = max(0.0, (t1 - t0) / (n1 - n0)) if n1 != n0 else 0.0  # noise must not make big batches free
        return t1 + slope * (n - n1)


@dataclass(frozen=True)
class NetProfile:
    rtt_ms: float
    up_bps: float
    down_bps: float


@dataclass(frozen=True, kw_only=True)
class CloudProfile:
    queue_ms: float
    verify_ms: float
    """Verifying one draft once it arrives (rules + LLM verifier)."""
    refine_ttft_ms: float
    refine_ms_per_token: float
    setup_ms: float = 0.0
    """A cloud-only request's time outside generation (queue excluded)."""

    def generation_ms(self, steps: float) -> float:
        return self.refine_ttft_ms + steps * self.refine_ms_per_token


@dataclass(frozen=True, kw_only=True)
class RequestShape:
    prompt_tokens: int
    draft_tokens: int
    n_drafts: int
    answer_tokens: int
    prompt_bytes: int
    draft_bytes: int
    answer_bytes: int
    rounds: float = 1.0
    """Expected draft rounds of a split (retry advice), from history."""
    split_steps: float = 0.0
    """Expected target decode steps refining after drafts (history)."""
    cloud_steps: float = 0.0
    """Expected target decode steps answering alone (history)."""
    split_work: float | None = None
    """Engine tokens a split costs the cloud, as the cloud reports it (``Summary.cost``); None: not measured."""
    cloud_work: float | None = None
    """Engine tokens the cloud plan costs the cloud, as reported; None: not measured."""


@dataclass(frozen=True)
class Escalation:
    """Auto's edge plan and its safety net: an edge answer that fails the rules is escalated to a
    split with its drafts. Its chance is the edge answer's rule-failure rate (``1 - quality`` of the
    edge plan)."""

    shape: RequestShape
    """The escalated split: ``rounds`` and ``split_steps`` from escalations' own history."""
    quality: float
    """Expected rule-validity of an escalated answer (history of escalations)."""


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    plan: Plan
    cold_start_ms: float
    drafting_ms: float
    transfer_ms: float
    cloud_ms: float
    quality: float
    """Expected rule-validity of the answer the plan returns (an escalation's included)."""
    escalation_p: float = 0.0
    """Chance the plan escalates (auto's edge plan: its answer fails the rules); 0 otherwise."""
    escalation_cost_ms: float = 0.0
    """What an escalation adds when it happens (the split after the edge attempt)."""
    cloud_work: float | None = None
    """Expected engine tokens the plan costs the cloud (the cloud's own report, history; an
    escalation's share included); None while a plan it needs was never measured."""

    @property
    def attempt_ms(self) -> float:
        """The plan's own run: what a request that does not escalate takes."""
        return self.cold_start_ms + self.drafting_ms + self.transfer_ms + self.cloud_ms

    @property
    def escalation_ms(self) -> float:
        """The escalation's expected share: its chance times its cost."""
        return self.escalation_p * self.escalation_cost_ms

    @property
    def total_ms(self) -> float:
        return self.attempt_ms + self.escalation_ms

    def as_dict(self) -> dict:
        return asdict(self) | {
            "attempt_ms": self.attempt_ms,
            "escalation_ms": self.escalation_ms,
            "total_ms": self.total_ms,
        }


@dataclass(frozen=True, kw_only=True)
class Choice:
    plan: Plan
    breakdowns: dict[Plan, Breakdown]
    """Every plan considered, at its expected values (what ``--explain`` prints and the result reports)."""
    reason: str
    notes: tuple[str, ...] = field(default=())


def cold_start_ms(e: EdgeProfile) -> float:
    if e.state == ModelState.WARM:
        return 0.0
    if e.state == ModelState.LOADING:
        return max(0.0, e.loading_remaining_ms) + e.first_run_ms
    disk = e.model_bytes / e.disk_read_bps * 1e3
    pcie = e.model_bytes / e.pcie_h2d_bps * 1e3 if e.pcie_h2d_bps else 0.0
    return disk + pcie + e.session_ms + e.warmup_ms + e.first_run_ms


def drafting_ms(e: EdgeProfile, r: RequestShape) -> float:
    return r.prompt_tokens * e.prefill_ms_per_token + r.draft_tokens * e.step(r.n_drafts)


def _ms(nbytes: int, bps: float) -> float:
    return nbytes / bps * 1e3


def _split(r: RequestShape, e: EdgeProfile, n: NetProfile, c: CloudProfile, quality: float) -> Breakdown:
    extra = max(0.0, r.rounds - 1.0)
    transfer = (1 + extra) * n.rtt_ms + _ms(r.prompt_bytes + r.draft_bytes, n.up_bps) + _ms(r.answer_bytes, n.down_bps)
    cloud = c.queue_ms + (1 + extra) * c.verify_ms + c.generation_ms(r.split_steps)
    return Breakdown(
        plan=Plan.SPLIT,
        cold_start_ms=cold_start_ms(e),
        drafting_ms=(1 + extra) * drafting_ms(e, r),
        transfer_ms=transfer,
        cloud_ms=cloud,
        quality=quality,
        cloud_work=r.split_work,
    )


def predict_escalation(r: RequestShape, e: EdgeProfile, n: NetProfile, c: CloudProfile, quality: float) -> Breakdown:
    """The split after a failed edge answer (``X`` in the module docstring), ``r`` its own shape:
    the first round's drafts exist (no drafting, all ``n`` sent at once), the edge is warm."""
    extra = max(0.0, r.rounds - 1.0)
    warm = dataclasses.replace(e, state=ModelState.WARM, first_run_ms=0.0)
    transfer = (
        (1 + extra) * n.rtt_ms
        + _ms(r.prompt_bytes + r.n_drafts * r.draft_bytes, n.up_bps)
        + _ms(r.answer_bytes, n.down_bps)
    )
    cloud = c.queue_ms + (1 + extra) * c.verify_ms + c.generation_ms(r.split_steps)
    return Breakdown(
        plan=Plan.SPLIT,
        cold_start_ms=0.0,
        drafting_ms=extra * drafting_ms(warm, r),
        transfer_ms=transfer,
        cloud_ms=cloud,
        quality=quality,
        cloud_work=r.split_work,
    )


def _edge(
    r: RequestShape,
    e: EdgeProfile,
    n: NetProfile | None,
    c: CloudProfile | None,
    quality: float,
    escalation: Escalation | None,
) -> Breakdown:
    bd = Breakdown(
        plan=Plan.EDGE,
        cold_start_ms=cold_start_ms(e),
        drafting_ms=drafting_ms(e, r),
        transfer_ms=0.0,
        cloud_ms=0.0,
        quality=quality,
        cloud_work=0.0,
    )
    if escalation is None or n is None or c is None:  # no cloud to escalate to: the edge's answer stands
        return bd
    p = min(1.0, max(0.0, 1.0 - quality))
    x = predict_escalation(escalation.shape, e, n, c, escalation.quality)
    return dataclasses.replace(
        bd,
        quality=quality + p * x.quality,
        escalation_p=p,
        escalation_cost_ms=x.total_ms,
        cloud_work=None if x.cloud_work is None else p * x.cloud_work,
    )


def predict(
    plan: Plan,
    r: RequestShape,
    e: EdgeProfile,
    n: NetProfile | None,
    c: CloudProfile | None,
    quality: float,
    escalation: Escalation | None = None,
) -> Breakdown:
    """One plan's expected breakdown; ``escalation``: the edge plan runs under auto (a failed answer
    goes to a split), so its cost and quality include that."""
    if plan == Plan.EDGE:
        return _edge(r, e, n, c, quality, escalation)
    if n is None or c is None:
        raise ValueError(f"{plan}: needs network and cloud profiles")
    if plan == Plan.SPLIT:
        return _split(r, e, n, c, quality)
    if plan == Plan.CLOUD:
        transfer = n.rtt_ms + _ms(r.prompt_bytes, n.up_bps) + _ms(r.answer_bytes, n.down_bps)
        return Breakdown(
            plan=Plan.CLOUD,
            cold_start_ms=0.0,
            drafting_ms=0.0,
            transfer_ms=transfer,
            cloud_ms=c.queue_ms + c.setup_ms + c.generation_ms(r.cloud_steps),
            quality=quality,
            cloud_work=r.cloud_work,
        )
    raise ValueError(f"plan: unknown {plan!r} (known: {', '.join(PLANS)})")


def predict_all(
    r: RequestShape,
    e: EdgeProfile,
    n: NetProfile | None,
    c: CloudProfile | None,
    quality: Mapping[Plan, float],
    escalation: Escalation | None = None,
) -> dict[Plan, Breakdown]:
    """Every plan's breakdown (the edge alone without a reachable cloud: ``n`` / ``c`` None); raises
    ValueError for a non-finite or negative prediction (a broken estimate must not choose)."""
    plans = PLANS if (n is not None and c is not None) else (Plan.EDGE,)
    bd = {p: predict(p, r, e, n, c, quality.get(p, 0.0), escalation) for p in plans}
    for b in bd.values():
        if not math.isfinite(b.total_ms) or b.total_ms < 0:
            raise ValueError(f"{b.plan}: non-finite or negative prediction {b.total_ms}")
    return bd


def pick(fastest_first: Sequence[Plan], quality: Mapping[Plan, float], quality_floor: float) -> tuple[Plan, bool]:
    """The objective over plans ordered fastest first: the first whose ``quality`` reaches ``quality_floor``
    (True), else the one of highest quality, the faster of equals (False)."""
    for p in fastest_first:
        if quality[p] >= quality_floor:
            return p, True
    return max(fastest_first, key=lambda p: (quality[p], -fastest_first.index(p))), False


def choose(
    r: RequestShape,
    e: EdgeProfile,
    n: NetProfile | None,
    c: CloudProfile | None,
    quality: Mapping[Plan, float],
    *,
    quality_floor: float = 0.0,
    escalation: Escalation | None = None,
) -> Choice:
    """The objective on the expected values: the fastest plan meeting the quality floor. Without a reachable
    cloud (``n``/``c`` None): edge. ``escalation``: the edge plan's answer escalates when it fails the rules
    (auto), so the edge is judged by its expected cost and quality with that split included."""
    bd = predict_all(r, e, n, c, quality, escalation)
    order = sorted(bd, key=lambda p: bd[p].total_ms)
    best, met = pick(order, {p: b.quality for p, b in bd.items()}, quality_floor)
    b = bd[best]
    if not met:
        reason = f"{best}: no plan reaches the quality floor {quality_floor:.2f}; highest expected quality"
        return Choice(plan=best, breakdowns=bd, reason=reason)
    others = ", ".join(
        f"{o.plan} {o.total_ms:.0f} ms" for o in sorted(bd.values(), key=lambda o: o.total_ms) if o is not b
    )
    reason = (
        f"{best}: fastest predicted ({b.total_ms:.0f} ms{escalation_note(b)}) with expected quality "
        f"{b.quality:.2f} >= floor {quality_floor:.2f}" + (f"; then {others}" if others else "")
    )
    return Choice(plan=best, breakdowns=bd, reason=reason)


def escalation_note(b: Breakdown) -> str:
    """``--explain``'s words for a plan's escalation share ("" where it never escalates)."""
    if b.escalation_p <= 0:
        return ""
    return f", {b.escalation_p:.0%} of answers escalated to split at {b.escalation_cost_ms:.0f} ms"
