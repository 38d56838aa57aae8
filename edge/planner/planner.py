"""The planner: estimates -> profiles -> the cost model's choice; measured requests -> estimates.

Online updates (each plan that ran, with its own result and times):
  drafting      step_ms.<n>           (drafting - prompt * prefill) / longest draft's tokens
  split, cloud  refine_ttft_ms, refine_ms_per_token from the cloud's summary (its decode steps
                and generation time); decode_steps.<plan>.<task>, the answer's length in steps
  split         verify_ms = what the split took beyond drafting, refinement and the transfer model
  cloud         setup_ms = what the request took beyond generation, the transfer model and queue
  split, cloud  cloud_tokens.<plan>.<task>: the engine tokens the cloud reports the answer cost it
                (``Summary.cost``), what ``cloud_thrift`` weighs plans by once both are measured
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
import time
from collections.abc import Callable
from dataclasses import dataclass

from coinfer.edge.planner.cost import (
    PLANS,
    Choice,
    CloudProfile,
    EdgeProfile,
    Escalation,
    NetProfile,
    RequestShape,
    choose,
    drafting_ms,
    predict,
    predict_escalation,
)
from coinfer.edge.planner.estimates import STALE_AFTER_S, Estimates
from coinfer.types import ModelState, Plan

log = logging.getLogger(__name__)

EXPLORE_RUNS = 5
"""Runs of each cloud plan auto makes for a task before it chooses by their measured outcomes alone."""
REEXPLORE_EVERY = 16
"""A cloud plan that has not run for this many of auto's choices for a task runs once: its estimates are
as old as its last run. Without it, a plan measured under a burst kept its burst-time prediction: split
on select, measured while overloaded at 1.6 s, was never chosen again while it answered in about 0.1 s
(``python -m benchmarks.capacity``: auto, after the split and cloud ladders, ran the cloud plan for every
one of 209 requests at 0.9x plain vLLM's capacity where split held 5x)."""
REEXPLORE_AFTER_S = STALE_AFTER_S
"""...and for this long: at 90 requests a second, 16 choices alone sent 6% of them to the plan auto judged
worse, 3 in 48 to the cloud plan on arith, each at 8x split's engine work. The age at which the estimates'
speeds count as stale (``STALE_AFTER_S``): the re-explored run's measurement then replaces them whole."""


@dataclass
class EdgeState:
    model_bytes: int
    state: str  # a ModelState (plain strings from the plan CLI compare equal)
    loading_remaining_ms: float = 0.0
    gpu: bool = False
    fresh: bool = False
    """No request drafted on this session yet (always so when cold or loading)."""

    @property
    def first_run(self) -> bool:
        return self.fresh or self.state != ModelState.WARM


class Planner:
    def __init__(
        self,
        est: Estimates,
        quality_floor: float = 0.0,
        cloud_thrift: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: seconds, for how long a plan has not run (``REEXPLORE_AFTER_S``)."""
        self.est = est
        self.clock = clock
        self.quality_floor = quality_floor
        self.cloud_thrift = cloud_thrift
        self._choices: dict[str, int] = {}
        """Auto's choices so far, per task (this process's: the estimates persist, this does not)."""
        self._last_run: dict[tuple[str, str], tuple[int, float]] = {}
        """(task, plan) -> the task's choice count and the clock when the plan last ran (chosen or asked for)."""

    @property
    def bytes_per_token(self) -> float:
        """Measured from drafts; 1 until then (no caveat: it only converts between the two sizes)."""
        return self.est.values.get("bytes_per_token", 1.0)

    def prompt_size(self, prompt: str) -> tuple[int, int]:
        """(tokens, bytes) of a prompt, tokens estimated from the measured bytes per token."""
        nbytes = len(prompt.encode())
        return max(1, round(nbytes / self.bytes_per_token)), nbytes

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

    def shape(self, task: str, prompt_tokens: int, prompt_bytes: int, n: int) -> RequestShape:
        e = self.est
        dt, at = e.get(f"draft_tokens.{task}"), e.get(f"answer_tokens.{task}")
        bpt = self.bytes_per_token
        return RequestShape(
            prompt_tokens=prompt_tokens,
            draft_tokens=round(dt),
            n_drafts=n,
            answer_tokens=round(at),
            prompt_bytes=prompt_bytes,
            draft_bytes=round(dt * bpt),
            answer_bytes=round(at * bpt),
            rounds=e.get(f"rounds.{task}"),
            split_steps=e.get(f"decode_steps.split.{task}"),
            cloud_steps=self._cloud_steps(task),
            split_work=self._work(f"cloud_tokens.split.{task}"),
            cloud_work=self._work(f"cloud_tokens.cloud.{task}"),
        )

    def _work(self, key: str) -> float | None:
        """The cloud's reported engine tokens per answer (``Summary.cost``) for a plan and task; None
        until measured (no default: a guessed cost would decide ``cloud_thrift`` on nothing)."""
        return self.est.values.get(key)

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

    def escalation(self, task: str, shape: RequestShape) -> Escalation:
        """Auto's edge plan escalating a rule-failing answer: the split's shape and quality from
        escalations' own history."""
        e = self.est
        x = dataclasses.replace(
            shape,
            rounds=e.get(f"rounds.escalated.{task}"),
            split_steps=e.get(f"decode_steps.escalated.{task}"),
            # an escalation's own reports, else a split's: the same session, its first round known bad
            split_work=w if (w := self._work(f"cloud_tokens.escalated.{task}")) is not None else shape.split_work,
        )
        return Escalation(shape=x, quality=e.get(f"quality.escalated.{task}"))

    def local_ms(self, task: str, prompt_tokens: int, prompt_bytes: int, n: int, edge: EdgeState) -> float:
        """Predicted time to draft this request locally on a warm edge model: how long before a
        cloud plan's deadline the edge starts its local answer (``EdgePipeline``'s hedge)."""
        try:
            warm = self.edge_profile(dataclasses.replace(edge, state=ModelState.WARM))
            return drafting_ms(warm, self.shape(task, prompt_tokens, prompt_bytes, n))
        except (ValueError, ZeroDivisionError):
            return 0.0

    def quality(self, task: str) -> dict[str, float]:
        return {p: self.est.get(f"quality.{p}.{task}") for p in PLANS}

    def choose(
        self, task: str, prompt_tokens: int, prompt_bytes: int, n: int, edge: EdgeState, cloud_available: bool
    ) -> Choice:
        """Auto's choice. With a cloud, the edge plan is predicted with its escalation (the service
        sends a rule-failing edge answer to a split while the cloud is healthy)."""
        # "default used" caveats are re-derived per choice; probe / refusal caveats stay
        self.est.forget("not measured yet")
        try:
            shape = self.shape(task, prompt_tokens, prompt_bytes, n)
            net, cloud = (self.net_profile(), self.cloud_profile()) if cloud_available else (None, None)
            esc = self.escalation(task, shape) if cloud_available else None
            c = choose(
                shape,
                self.edge_profile(edge),
                net,
                cloud,
                self.quality(task),
                self.quality_floor,
                esc,
                self.cloud_thrift,
            )
        except (ValueError, ZeroDivisionError) as exc:  # never let the planner fail a request
            self.est.note(f"cost model failed ({exc}); falling back to split", key="cost model failed")
            return Choice(
                plan="split" if cloud_available else "edge",
                breakdowns={},
                reason="fallback: cost model failed",
                notes=tuple(self.est.notes),
            )
        plan, reason = c.plan, c.reason
        choice = self._choices[task] = self._choices.get(task, 0) + 1
        if (p := self._unexplored(task, c)) is not None:
            runs = self.est.counts.get(f"decode_steps.{p}.{task}", 0)
            plan, reason = (
                p,
                (
                    f"explore: {p} was run {runs} of {EXPLORE_RUNS} times for {task!r} (its "
                    f"{c.breakdowns[p].total_ms:.0f} ms is not yet a measurement); else {c.reason}"
                ),
            )
        elif (p := self._stale(task, c, choice)) is not None:
            plan, reason = (
                p,
                f"re-explore: {p} has not run for {REEXPLORE_EVERY} choices and {REEXPLORE_AFTER_S:.0f} s for "
                f"{task!r} (its {c.breakdowns[p].total_ms:.0f} ms is as old as that); else {c.reason}",
            )
        self._last_run[(task, str(plan))] = (choice, self.clock())
        return Choice(plan=plan, breakdowns=c.breakdowns, reason=reason, notes=tuple(self.est.notes))

    def _unexplored(self, task: str, c: Choice) -> str | None:
        """A cloud plan auto has run fewer than ``EXPLORE_RUNS`` times for ``task`` and that meets the
        quality floor: run it. A prediction from defaults is never corrected otherwise (with the drafts
        accepted as is more often, split answered word problems at a median 104 ms against 428 ms
        predicted, and auto, never running it, kept choosing the cloud plan), and one run is not an
        estimate of a two-valued outcome: of 60 word-problem splits 42 decoded 0 steps (a verified
        draft taken as is) and 18 decoded 35-251; auto, having run split once, predicted it at
        478-547 ms against a measured mean of 269 and never ran it again."""
        for p in (Plan.SPLIT, Plan.CLOUD):
            b = c.breakdowns.get(p)
            if (
                b is not None
                and self.est.counts.get(f"decode_steps.{p}.{task}", 0) < EXPLORE_RUNS
                and b.quality >= self.quality_floor
            ):
                return p
        return None

    def _stale(self, task: str, c: Choice, choice: int) -> str | None:
        """A cloud plan not chosen by auto ``c`` that has not run for ``REEXPLORE_EVERY`` of the task's
        choices nor for ``REEXPLORE_AFTER_S``, and meets the quality floor: run it."""
        now = self.clock()
        for p in (Plan.SPLIT, Plan.CLOUD):
            b = c.breakdowns.get(p)
            last_choice, last_s = self._last_run.get((task, str(p)), (0, -float("inf")))
            if (
                p != c.plan
                and b is not None
                and b.quality >= self.quality_floor
                and choice - last_choice >= REEXPLORE_EVERY
                and now - last_s >= REEXPLORE_AFTER_S
            ):
                return p
        return None

    # ---- online updates ------------------------------------------------------------
    def observe(
        self,
        plan: str,
        task: str,
        prompt_tokens: int,
        prompt_bytes: int,
        n: int,
        result,
        edge_was: EdgeState,
        escalated: bool = False,
    ) -> None:
        """Fold one plan's run (its own result and stage times) into the estimates. ``escalated``:
        the split that followed auto's rule-failing edge answer, whose drafts the edge attempt's
        own observation already measured."""
        e = self.est
        self._last_run[(task, str(plan))] = (self._choices.get(task, 0), self.clock())  # a plan asked for runs too
        if not escalated:
            self._observe_drafts(task, prompt_tokens, prompt_bytes, n, result, edge_was)
        if result.answer and not result.fallback_reason:  # a fallback's answer is a local draft
            e.observe(f"answer_tokens.{task}", max(1.0, len(result.answer.encode()) / self.bytes_per_token))
        if not result.fallback_reason:
            self._observe_quality(plan, task, n, result, escalated)
        if result.summary is not None and not result.fallback_reason and plan in ("split", "cloud"):
            self._observe_cloud(plan, task, prompt_tokens, prompt_bytes, n, result, edge_was, escalated)
        e.save()

    def _observe_drafts(
        self, task: str, prompt_tokens: int, prompt_bytes: int, n: int, result, edge_was: EdgeState
    ) -> None:
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
            step = (t["drafting"] - prompt_tokens * e.get("prefill_ms_per_token")) / longest
            if step > 0:
                e.observe(f"step_ms.{n}", step)
        else:  # the first request on a fresh session: what it drafted beyond a warm one
            warm = drafting_ms(
                self.edge_profile(EdgeState(edge_was.model_bytes, ModelState.WARM, gpu=edge_was.gpu)),
                dataclasses.replace(self.shape(task, prompt_tokens, prompt_bytes, n), draft_tokens=longest),
            )
            e.observe("first_run_ms", max(0.0, t["drafting"] - warm))

    def _observe_quality(self, plan: str, task: str, n: int, result, escalated: bool) -> None:
        e = self.est
        e.observe(f"quality.{'escalated' if escalated else plan}.{task}", 1.0 if result.valid else 0.0)
        if plan == "split" and not escalated:
            # what edge-only would have answered: valid iff a first-round draft passed the rules
            # (the cloud checks the same rule set; the judge verifier may also reject) — so a
            # floor that keeps requests off the edge plan does not freeze its quality estimate.
            # Not for an escalation: its edge attempt was observed with the edge's own verdict.
            first = [v for i, v in result.verdicts.items() if i < n]
            if first:
                e.observe(f"quality.edge.{task}", 1.0 if any(v.valid for v in first) else 0.0)

    def _observe_cloud(
        self,
        plan: str,
        task: str,
        prompt_tokens: int,
        prompt_bytes: int,
        n: int,
        result,
        edge_was: EdgeState,
        escalated: bool,
    ) -> None:
        e = self.est
        t, tm = result.timings, result.summary.timings
        kind = "escalated" if escalated else plan
        # the cloud's generation: its speed (fast-tracked) apart from this answer's length (averaged)
        # 0 steps is an answer too: the cloud accepted a verified draft as it stands
        e.observe(f"decode_steps.{kind}.{task}", float(tm.decode_steps))
        if result.summary.cost is not None:  # what the answer cost the cloud, as the cloud counts it
            e.observe(f"cloud_tokens.{kind}.{task}", float(result.summary.cost.work_tokens))
        if tm.decode_steps > 0:
            if tm.refine_ttft_ms > 0:
                # net of the queue wait the Status RPC reported: the cost model adds that itself
                e.observe("refine_ttft_ms", max(0.0, tm.refine_ttft_ms - e.get("queue_ms")))
                if tm.refine_ms > tm.refine_ttft_ms:
                    e.observe("refine_ms_per_token", (tm.refine_ms - tm.refine_ttft_ms) / tm.decode_steps)
        # the cost model's own transfer term, with the rounds this request really took
        shape = dataclasses.replace(
            self.shape(task, prompt_tokens, prompt_bytes, n), rounds=float(max(1, result.rounds))
        )
        if escalated:
            transfer = predict_escalation(
                shape, self.edge_profile(edge_was), self.net_profile(), self.cloud_profile(), 0.0
            ).transfer_ms
        else:
            transfer = predict(
                plan, shape, self.edge_profile(edge_was), self.net_profile(), self.cloud_profile(), 0.0
            ).transfer_ms
        rest = t.get("total", 0.0) - tm.refine_ms - transfer - e.get("queue_ms")
        if plan == "cloud":
            e.observe("setup_ms", max(0.0, rest))
            return
        e.observe(f"rounds.{task}" if not escalated else f"rounds.escalated.{task}", shape.rounds)
        if edge_was.state == ModelState.WARM or escalated:  # an escalation's edge is warm: it just drafted
            e.observe("verify_ms", max(0.0, (rest - t.get("drafting", 0.0)) / shape.rounds))
