"""The judge: turns a draft into a verdict. The rules first (no model time for a draft they fail), then
the LLM verifier (the target's likelihood of the draft, or a judge model's verdict); a structural
duplicate of a draft being verified waits for that verdict and counts as its support. Where the rules
decide (``SessionContext.rules_decide``), a draft that passes them is valid with no model asked.

The judge keeps the session's board: every draft's verdict (``judged``) and the target's logprobs of
those it scored, which the answerer reads (``mean_logprob``, ``min_logprob``) and the ranking orders
(``ranked``). It also re-checks an answer the cloud wrote (``recheck``) by the same rules and threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable

from coinfer import types as t
from coinfer.cloud.acceptance import likelihood_floor
from coinfer.cloud.context import SessionContext
from coinfer.cloud.policy import likelihood_score, mean_logprob
from coinfer.cloud.ranking import MS_PER_S, Judged, Ranked, rank
from coinfer.cloud.verifier import JUDGE_MAX_TOKENS, JUDGE_SCHEMA, judge_prompt, parse_judge
from coinfer.rules import RuleResult
from coinfer.serving.offload import run_sized
from coinfer.tasks import Parsed

ACCEPTED_FIRST = "a draft before it was accepted as is"
"""Why the drafts after one that stood as is are not scored (``PolicyConfig.accept_first``)."""
RECHECK = -1
"""The index a re-checked answer is verified under: not a draft's, so nothing is recorded for it."""
NOT_SCORED = "not_scored"
"""The error code of a draft the rules passed and no LLM verifier judged (``Judge.skip_scoring``)."""


class Judge:
    """Verdicts on a session's drafts, and the board of what was judged."""

    def __init__(
        self,
        ctx: SessionContext,
        *,
        weights: tuple[float, float, float] | None = None,
        load: float = 0.0,
        stands: Callable[[Judged], bool] | None = None,
    ) -> None:
        """``stands``: whether a judged draft is the answer as it stands whatever drafts are still to come
        (``PolicyConfig.accept_first``): the judge then scores no more drafts (``ACCEPTED_FIRST``), before the
        next one's turn, and ``first`` is that draft."""
        self.ctx = ctx
        self._stands = stands
        self.first: Judged | None = None
        """The first draft that stood as is (``stands``), once one did."""
        p = ctx.policy
        self.weights = weights or (p.a, p.b, p.g)
        """Scheduler weights (a, b, g) the ranking uses: the learned ones, else the configured ones."""
        self.load = load
        """Engine load at open: raises the latency weight."""
        self.judged: dict[int, Judged] = {}
        """Every draft judged so far, by index."""
        self._pending: dict[object, asyncio.Future] = {}
        """The verdict of each draft being verified, by its dedup key: a duplicate waits for it."""
        self._turn: asyncio.Future | None = None
        """Resolved once the latest draft to arrive has claimed its dedup key (or failed the rules)."""
        self._min_lp: dict[int, float] = {}
        self._mean_lp: dict[int, float] = {}
        self._scoring = asyncio.Event()
        self._scoring.set()
        self._unscored = ""
        """Why drafts waiting for the LLM verifier are not scored ('' : they are, once ``_scoring`` is set)."""
        self._one_at_a_time = asyncio.Lock() if p.accept_first and ctx.free_text else contextlib.nullcontext()
        """Held while the LLM verifier scores a draft where one may answer the session alone
        (``PolicyConfig.accept_first``, free text): the next waits, and is not scored once a draft before it
        answered the session (``skip_scoring``). An extracted answer needs its round's agreement: its
        drafts are scored side by side."""

    def defer_scoring(self) -> None:
        """Drafts that pass the rules wait before the LLM verifier is asked (``skip_scoring`` ends the wait).
        While the cloud's own answer races the drafts (``coinfer.cloud.hedge``) their scoring would slow
        it on the same engine, for drafts the odds say will not be valid: a prefill per draft (Gemma 3
        270M on one core: split 4.1 s against the hedge's own 2.1 s with the drafts scored at the
        round's end). Where the rules decide, nothing waits: no model is asked."""
        self._scoring.clear()

    def skip_scoring(self, why: str) -> None:
        """Drafts waiting for the LLM verifier get an invalid verdict saying ``why`` (``NOT_SCORED``), with no
        model asked."""
        self._unscored = why
        self._scoring.set()

    async def _scoring_allowed(self) -> str:
        """Once drafts may be scored (at once unless deferred): why they are not ('' : they are)."""
        await self._scoring.wait()
        return self._unscored

    def mean_logprob(self, index: int) -> float | None:
        """The target's mean per-token logprob of draft ``index`` (None: not scored by likelihood)."""
        return self._mean_lp.get(index)

    def min_logprob(self, index: int) -> float | None:
        """The target's logprob of draft ``index``'s least likely token (None: not scored by likelihood)."""
        return self._min_lp.get(index)

    def ranked(self) -> Ranked:
        """The valid drafts judged so far, best first (``coinfer.cloud.ranking.rank``)."""
        return rank(self.judged.values(), self.ctx.task, self.weights, self.load)

    async def verdict(self, d: t.Draft) -> t.Verdict:
        """Judge draft ``d`` and record it. Drafts' rule checks run side by side in threads, but they
        claim their dedup keys in arrival order (each waits for the one before it to have claimed): the
        first of two duplicates to arrive is the one verified, whichever thread finishes first."""
        t_start = time.perf_counter()
        turn, before = asyncio.get_running_loop().create_future(), self._turn
        self._turn = turn
        try:
            res, parsed, text, repaired = await run_sized(self.ctx.rules.check_size(d.text), self._checked, d.text)
            if repaired:
                # what was judged, and what an answer takes; the draft model's own logprob was of the text
                # as written: a repaired draft is held to the absolute likelihood threshold
                d = dataclasses.replace(d, text=text, mean_logprob=0.0)
            if before is not None:
                await before
            if not res.valid:  # rules fail fast: no model time spent
                turn.set_result(None)
                v = t.Verdict(
                    draft_index=d.index,
                    valid=False,
                    error=res.error,
                    failed_rule=res.failed_rule,
                    rules_passed=res.passed,
                )
            else:
                v = await self._verified(d, self.ctx.task.dedup_key(d.text, parsed), res.passed, turn, parsed)
                v.repaired = repaired
        finally:
            if not turn.done():  # cancelled or failed before its claim: the next draft must not wait forever
                turn.set_result(None)
        v.verify_ms = (time.perf_counter() - t_start) * MS_PER_S
        self.judged[d.index] = Judged(draft=d, verdict=v, support=0 if v.duplicate_of else 1, parsed=parsed)
        return v

    def _checked(self, text: str) -> tuple[RuleResult, Parsed, str, str]:
        """The rules on ``text``, and where repairs are made (``SessionContext.repairs``) on its calculator
        repair where it fails them (``RuleSet.check_repaired``; in a worker thread: client rules)."""
        if self.ctx.repairs:
            return self.ctx.rules.check_repaired(text)
        res, parsed = self.ctx.rules.check(text)
        return res, parsed, text, ""

    async def _verified(
        self, d: t.Draft, key: object, passed: list[str], turn: asyncio.Future, parsed: Parsed
    ) -> t.Verdict:
        """The LLM verifier's verdict on a draft that passed the rules; a duplicate of one being
        verified (same ``key``) shares its verdict, counted as support, not verified twice. ``turn`` is
        released once the key is claimed (synchronously, before any wait)."""
        if key in self._pending:
            turn.set_result(None)
            orig = await asyncio.shield(self._pending[key])
            self.judged[orig.draft_index].support += 1
            if orig.draft_index in self._min_lp:
                self._min_lp[d.index] = self._min_lp[orig.draft_index]
                self._mean_lp[d.index] = self._mean_lp[orig.draft_index]
            return dataclasses.replace(orig, draft_index=d.index, verify_ms=0.0, duplicate_of=orig.draft_index + 1)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        turn.set_result(None)
        try:
            if self.ctx.rules_decide:  # llm_verdict asks no model: nothing to defer or wait for
                v = await self.llm_verdict(d.index, d.text, passed)
                self._accept_first(Judged(draft=d, verdict=v, parsed=parsed))
            elif self.ctx.exact:  # the target takes the draft's tokens it would write: nothing to score here
                v = t.Verdict(draft_index=d.index, valid=True, rules_passed=passed)
            elif unscored := await self._scoring_allowed():
                v = self._unscored_verdict(d.index, passed, unscored)
            else:
                async with self._one_at_a_time:
                    if self._unscored:  # a draft before this one answered the session meanwhile
                        v = self._unscored_verdict(d.index, passed, self._unscored)
                    else:
                        v = await self.llm_verdict(d.index, d.text, passed, own=d.mean_logprob, truncated=d.truncated)
                        self._accept_first(Judged(draft=d, verdict=v, parsed=parsed))
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        fut.set_result(v)
        return v

    def _accept_first(self, j: Judged) -> None:
        """Where ``j`` stands as is, no draft after it is scored: at once, before the next one's turn."""
        if self.first is None and not self._unscored and self._stands is not None and self._stands(j):
            self.first = j
            self.skip_scoring(ACCEPTED_FIRST)

    def _unscored_verdict(self, index: int, passed: list[str], why: str) -> t.Verdict:
        return t.Verdict(
            draft_index=index,
            valid=False,
            error=f"{NOT_SCORED}: {why}",
            failed_rule=self.ctx.policy.verifier.value,
            rules_passed=passed,
        )

    async def llm_verdict(
        self, index: int, text: str, passed: list[str], *, own: float | None = None, truncated: bool = False
    ) -> t.Verdict:
        """The LLM verifier's verdict on ``text`` (it passed rules ``passed``); ``own``: the draft model's
        mean logprob of it, the likelihood threshold's reference. Records the target's logprobs of a draft
        (``index`` >= 0)."""
        if self.ctx.rules_decide:  # exact checkers passed: the draft is right, no model time to say so
            return t.Verdict(draft_index=index, valid=True, score=1.0, rules_passed=passed)
        if self.ctx.policy.verifier == t.VerifierKind.JUDGE:
            return await self._judge_verdict(index, text, passed)
        lps = await self.ctx.engine.continuation_logprobs(
            self.ctx.prompt_text, text, self.ctx.request_id(f"v{index}"), end=not truncated
        )
        mean = mean_logprob(lps)
        if index >= 0 and lps:
            self._min_lp[index], self._mean_lp[index] = min(lps), mean
        floor = likelihood_floor(self.ctx.policy, own)
        if self.ctx.thresholded and mean < floor:
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

    async def _judge_verdict(self, index: int, text: str, passed: list[str]) -> t.Verdict:
        """A judge model's verdict ({valid, score, error} as constrained JSON)."""
        ctx = self.ctx
        out = await ctx.engine.judge(
            judge_prompt(ctx.req.question, text), JUDGE_SCHEMA, JUDGE_MAX_TOKENS, ctx.request_id(f"j{index}")
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

    async def recheck(
        self, text: str, *, likelihood: bool = True, than: float | None = None, truncated: bool = False
    ) -> tuple[bool, str, Parsed]:
        """Re-verify an answer the cloud wrote as a draft: (valid, why not, what the rules extracted).
        Extraction + rules, then the verifier's threshold, relative to ``than`` (the target's mean
        logprob of the draft the answer would replace: a refinement of free prose scored -0.81 against
        the conversation, under the absolute -0.5, where the draft it refined scored -0.75).
        ``likelihood=False`` for the target's own answers: its greedy answer *is* its most likely one,
        and a threshold set for drafts of free prose would refuse it (then sample candidates, refuse
        those too, and run into the deadline)."""
        res, parsed = await run_sized(self.ctx.rules.check_size(text), self.ctx.rules.check, text)
        if not res.valid:
            return False, f"{res.failed_rule}: {res.error}", parsed
        if likelihood and self.ctx.thresholded and self.ctx.policy.verifier == t.VerifierKind.LIKELIHOOD:
            v = await self.llm_verdict(RECHECK, text, res.passed, own=than, truncated=truncated)
            if not v.valid:
                return False, v.error, parsed
        return True, "", parsed
