"""Verification of a session's drafts: the rules first, then the LLM verifier (the target's likelihood of
the draft, or a judge's verdict), duplicates merged as support; and the ranking of the valid ones.

A mixin of ``coinfer.cloud.session.Session``, whose state it reads and fills (``judged``, ``min_logprob``,
``mean_lp``, ``outcome``); split out so that each concern of a session reads in one file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time

from coinfer import types as t
from coinfer.cloud.policy import answer_agreement, likelihood_score, load_scaled_g, mean_logprob, rank_scores
from coinfer.cloud.session_state import Judged, Ranked, SessionState
from coinfer.cloud.verifier import JUDGE_MAX_TOKENS, JUDGE_SCHEMA, judge_prompt, parse_judge
from coinfer.tasks import OPEN


class Judging(SessionState):
    """Verifies drafts as they arrive and ranks the valid ones."""

    @functools.cached_property
    def prompt_text(self) -> str:
        """The conversation rendered with the target's chat template (computed once)."""
        return self.engine.render(self.req.conversation)

    @property
    def _thresholded(self) -> bool:
        """The likelihood threshold judges open requests; a built-in preset's checkers are exact."""
        return self.task is OPEN

    async def _verify(self, d: t.Draft, pending: dict) -> t.Verdict:
        t_start = time.perf_counter()
        res, parsed = await asyncio.to_thread(self.rules.check, d.text)  # client rules: off the loop
        if not res.valid:  # rules fail fast: no model time spent
            v = t.Verdict(
                draft_index=d.index, valid=False, error=res.error, failed_rule=res.failed_rule, rules_passed=res.passed
            )
        else:
            key = self.task.dedup_key(d.text, parsed)
            if key in pending:  # a duplicate: counted as support, not verified twice
                orig = await asyncio.shield(pending[key])
                self.judged[orig.draft_index].support += 1
                if orig.draft_index in self.min_logprob:
                    self.min_logprob[d.index] = self.min_logprob[orig.draft_index]
                    self.mean_lp[d.index] = self.mean_lp[orig.draft_index]
                v = dataclasses.replace(orig, draft_index=d.index, verify_ms=0.0, duplicate_of=orig.draft_index + 1)
            else:
                fut: asyncio.Future = asyncio.get_running_loop().create_future()
                pending[key] = fut
                try:
                    v = await self._llm_verdict(d.index, d.text, res.passed, own=d.mean_logprob, truncated=d.truncated)
                except BaseException as exc:
                    fut.set_exception(exc)
                    fut.exception()  # mark retrieved
                    raise
                fut.set_result(v)
        v.verify_ms = (time.perf_counter() - t_start) * 1e3
        self.judged[d.index] = Judged(d, v, support=0 if v.duplicate_of else 1, parsed=parsed)
        return v

    def _floor(self, own: float | None) -> float:
        """The likelihood threshold for a draft whose model gave it mean logprob ``own`` (None: the
        absolute one). Relative to the draft model's own confidence, so that free prose (a real
        model's drafts score -0.6..-2 per token: natural text is not formulaic) passes where the
        target agrees with the draft model, and text the target finds far less likely than the draft
        model did fails; never stricter than ``min_mean_logprob``, never looser than its floor."""
        p = self.cfg.policy
        if own is None or not own < 0.0 or p.relative_margin is None:  # proto3: 0 = not reported
            return p.min_mean_logprob
        return max(p.min_mean_logprob_floor, min(p.min_mean_logprob, own - p.relative_margin))

    async def _llm_verdict(
        self, index: int, text: str, passed: list[str], own: float | None = None, truncated: bool = False
    ) -> t.Verdict:
        if self.rules_decide:  # exact checkers passed: the draft is right, no model time to say so
            return t.Verdict(draft_index=index, valid=True, score=1.0, rules_passed=passed)
        if self.cfg.policy.verifier == t.VerifierKind.JUDGE:
            out = await self.engine.judge(
                judge_prompt(self.req.question, text), JUDGE_SCHEMA, JUDGE_MAX_TOKENS, f"{self.key}-j{index}"
            )
            valid, score, error = parse_judge(out)
            return t.Verdict(
                draft_index=index,
                valid=valid,
                score=score,
                error=error,
                failed_rule="" if valid else t.VerifierKind.JUDGE.value,
                rules_passed=passed + ([t.VerifierKind.JUDGE.value] if valid else []),
            )
        lps = await self.engine.continuation_logprobs(self.prompt_text, text, f"{self.key}-v{index}", end=not truncated)
        mean = mean_logprob(lps)
        if index >= 0 and lps:
            self.min_logprob[index], self.mean_lp[index] = min(lps), mean
        floor = self._floor(own)
        if self._thresholded and mean < floor:
            return t.Verdict(
                draft_index=index,
                valid=False,
                score=likelihood_score(lps),
                failed_rule=t.VerifierKind.LIKELIHOOD.value,
                error=f"low_likelihood: mean logprob {mean:.2f} < {floor:.2f} per token",
                rules_passed=passed,
            )
        return t.Verdict(
            draft_index=index,
            valid=True,
            score=likelihood_score(lps),
            rules_passed=passed + [t.VerifierKind.LIKELIHOOD.value],
        )

    def _ranked(self) -> Ranked:
        """Valid drafts, best first: (judged, rank score, agreement on the extracted answer). A draft
        that ended by itself comes before one cut at its budget, whatever their scores (as the edge's
        local choice): a truncated draft's likelihood is that of an answer that never reached its
        end (SmolLM2: a French ramble cut at 64 tokens outranked "The capital of France is Paris.")."""
        cands = [j for j in self.judged.values() if j.verdict.valid and not j.verdict.duplicate_of]
        if not cands:
            return []
        p = self.cfg.policy
        a, b, g = self.weights or (p.a, p.b, p.g)
        agree = answer_agreement([self.task.answer_key(j.parsed) for j in cands], [j.support for j in cands])
        ranks = rank_scores(
            [j.verdict.score for j in cands],
            [j.verdict.verify_ms / 1e3 for j in cands],
            a,
            b,
            load_scaled_g(g, self.load),
            agree=agree,
        )
        return sorted(zip(cands, ranks, agree), key=lambda x: (x[0].draft.truncated, -x[1]))

    def _outcome(self, ranked: Ranked, answer: str) -> None:
        """Label each ranked draft for the weight learner: graded right, else agrees with the answer."""
        final_key = self.task.answer_key(self.rules.parse(answer))
        for j, _, agree in ranked:
            try:
                label = float(self.task.grade(self.spec, j.parsed))
            except Exception:  # noqa: BLE001 - a task that cannot grade: agreement with the answer
                label = float(self.task.answer_key(j.parsed) == final_key)
            self.outcome.append((j.verdict.score, agree, j.verdict.verify_ms / 1e3, label))
