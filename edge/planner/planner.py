"""The planner: estimates -> profiles -> the cost model's choice; measured requests -> estimates.

Online updates (each finished request):
  drafting      step_ms.<n>           (drafting - prompt * prefill) / longest draft's tokens
  split, cloud  refine_ttft_ms, refine_ms_per_token from the cloud's summary (its decode steps
                and generation time); decode_steps.<plan>.<task>, the answer's length in steps
  split         verify_ms = what the split took beyond drafting, refinement and the transfer model
  cloud         setup_ms = what the request took beyond generation, the transfer model and queue
  every plan    draft / answer sizes per task, quality.<plan>.<task> (rule-valid answers); a split
                also measures quality.edge (was any first-round draft rule-valid)
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from edge.planner.cost import (
    PLANS,
    Choice,
    CloudProfile,
    EdgeProfile,
    NetProfile,
    RequestShape,
    choose,
    drafting_ms,
    predict,
)
from edge.planner.estimates import Estimates

log = logging.getLogger(__name__)


@dataclass
class EdgeState:
    model_bytes: int
    state: str  # cold | loading | warm
    loading_remaining_ms: float = 0.0
    gpu: bool = False
    fresh: bool = False
    """No request drafted on this session yet (always so when cold or loading)."""

    @property
    def first_run(self) -> bool:
        return self.fresh or self.state != "warm"


class Planner:
    def __init__(self, est: Estimates, quality_floor: float = 0.0) -> None:
        self.est = est
        self.quality_floor = quality_floor

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
        return EdgeProfile(model_bytes=s.model_bytes, disk_read_bps=e.get("disk_read_bps"),
                           pcie_h2d_bps=e.get("pcie_h2d_bps") if s.gpu else None, session_ms=e.get("session_ms"),
                           warmup_ms=e.get("warmup_ms"), prefill_ms_per_token=e.get("prefill_ms_per_token"),
                           step_ms=e.step_ms(), state=s.state, loading_remaining_ms=s.loading_remaining_ms,
                           first_run_ms=e.get("first_run_ms") if s.first_run else 0.0)

    def net_profile(self) -> NetProfile:
        e = self.est
        return NetProfile(e.get("rtt_ms"), e.get("up_bps"), e.get("down_bps"))

    def cloud_profile(self) -> CloudProfile:
        e = self.est
        return CloudProfile(e.get("queue_ms"), e.get("verify_ms"), e.get("refine_ttft_ms"),
                            e.get("refine_ms_per_token"), e.get("setup_ms"))

    def shape(self, task: str, prompt_tokens: int, prompt_bytes: int, n: int) -> RequestShape:
        e = self.est
        dt, at = e.get(f"draft_tokens.{task}"), e.get(f"answer_tokens.{task}")
        bpt = self.bytes_per_token
        return RequestShape(prompt_tokens, round(dt), n, round(at), prompt_bytes, round(dt * bpt), round(at * bpt),
                            rounds=e.get(f"rounds.{task}"), split_steps=e.get(f"decode_steps.split.{task}"),
                            cloud_steps=e.get(f"decode_steps.cloud.{task}"))

    def quality(self, task: str) -> dict[str, float]:
        return {p: self.est.get(f"quality.{p}.{task}") for p in PLANS}

    def choose(self, task: str, prompt_tokens: int, prompt_bytes: int, n: int, edge: EdgeState,
               cloud_available: bool) -> Choice:
        # "default used" caveats are re-derived per choice; probe / refusal caveats stay
        self.est.forget("not measured yet")
        try:
            shape = self.shape(task, prompt_tokens, prompt_bytes, n)
            net, cloud = (self.net_profile(), self.cloud_profile()) if cloud_available else (None, None)
            c = choose(shape, self.edge_profile(edge), net, cloud, self.quality(task), self.quality_floor)
        except (ValueError, ZeroDivisionError) as exc:  # never let the planner fail a request
            self.est.note(f"cost model failed ({exc}); falling back to split", key="cost model failed")
            return Choice("split" if cloud_available else "edge", {}, "fallback: cost model failed",
                          tuple(self.est.notes))
        return Choice(c.plan, c.breakdowns, c.reason, tuple(self.est.notes))

    # ---- online updates ------------------------------------------------------------
    def observe(self, plan: str, task: str, prompt_tokens: int, prompt_bytes: int, n: int, result,
                edge_was: EdgeState) -> None:
        """Fold one finished request's measured stage times into the estimates."""
        e = self.est
        t = result.timings
        drafts = result.drafts
        if drafts:
            longest = max(d.num_tokens for d in drafts)
            if longest:
                e.observe(f"draft_tokens.{task}", float(longest))
                nbytes = sum(len(d.text.encode()) for d in drafts)
                ntok = sum(d.num_tokens for d in drafts)
                if ntok:
                    e.observe("bytes_per_token", max(nbytes / ntok, 0.25))
            # one round only: a retry round drafts at another batch size (the cloud's advice)
            if "drafting" in t and longest and result.rounds <= 1:
                if not edge_was.first_run:
                    step = (t["drafting"] - prompt_tokens * e.get("prefill_ms_per_token")) / longest
                    if step > 0:
                        e.observe(f"step_ms.{n}", step)
                else:  # the first request on a fresh session: what it drafted beyond a warm one
                    warm = drafting_ms(self.edge_profile(EdgeState(edge_was.model_bytes, "warm", gpu=edge_was.gpu)),
                                       dataclasses.replace(self.shape(task, prompt_tokens, prompt_bytes, n),
                                                           draft_tokens=longest))
                    e.observe("first_run_ms", max(0.0, t["drafting"] - warm))
        if result.answer and not result.fallback_reason:  # a fallback's answer is a local draft
            e.observe(f"answer_tokens.{task}", max(1.0, len(result.answer.encode()) / self.bytes_per_token))
        if not result.fallback_reason:
            e.observe(f"quality.{plan}.{task}", 1.0 if result.valid else 0.0)
            if plan == "split":
                # what edge-only would have answered: valid iff a first-round draft passed the rules
                # (the cloud checks the same rule set; the judge verifier may also reject) — so a
                # floor that keeps requests off the edge plan does not freeze its quality estimate
                first = [v for i, v in result.verdicts.items() if i < n]
                if first:
                    e.observe(f"quality.edge.{task}", 1.0 if any(v.valid for v in first) else 0.0)
        s = result.summary
        if s is not None and not result.fallback_reason and plan in ("split", "cloud"):
            tm = s.timings
            # the cloud's generation: its speed (fast-tracked) apart from this answer's length (averaged)
            if tm.decode_steps > 0:
                e.observe(f"decode_steps.{plan}.{task}", float(tm.decode_steps))
                if tm.refine_ttft_ms > 0:
                    # net of the queue wait the Status RPC reported: the cost model adds that itself
                    e.observe("refine_ttft_ms", max(0.0, tm.refine_ttft_ms - e.get("queue_ms")))
                    if tm.refine_ms > tm.refine_ttft_ms:
                        e.observe("refine_ms_per_token", (tm.refine_ms - tm.refine_ttft_ms) / tm.decode_steps)
            # the cost model's own transfer term, with the rounds this request really took
            shape = dataclasses.replace(self.shape(task, prompt_tokens, prompt_bytes, n),
                                        rounds=float(max(1, result.rounds)))
            transfer = predict(plan, shape, self.edge_profile(edge_was), self.net_profile(), self.cloud_profile(),
                               0.0).transfer_ms
            rest = t.get("total", 0.0) - tm.refine_ms - transfer - e.get("queue_ms")
            if plan == "cloud":
                e.observe("setup_ms", max(0.0, rest))
            else:
                e.observe(f"rounds.{task}", shape.rounds)
                if edge_was.state == "warm":
                    e.observe("verify_ms", max(0.0, (rest - t.get("drafting", 0.0)) / shape.rounds))
        e.save()
