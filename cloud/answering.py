"""The answerer: turns a session's ranked verdicts into its answer. The best verified draft as is (or
continued where it was cut at the draft budget), a refinement of the drafts (a verified prefix
continued, or the best drafts as candidates), or, with no valid draft, the cloud alone
(``coinfer.cloud.alone``); each answer re-checked (``Judge.recheck``) before it replaces the drafts
(docs/design.md §2.2). What it streams goes through the session's ``AnswerStream``.

Each chunk says whether the answer streamed so far is final (``AnswerChunk.final``): it is when every
answer the session can still end on begins with it. A draft accepted as is is final; a continuation or
a prefix refinement is final while it writes what its fallback (the best draft) says, since a rejection
returns that draft; the cloud's own answer is final where nothing but the loop watch can refuse it
(``RuleSet.only_loop_watch``), and is then kept whatever follows (no correction, no candidates: they
would withdraw it), and final step by step where the rules can judge its steps (``RuleSet.streams_steps``:
every rule judges a prefix, or a preset's steps and an extraction's text before its marker, the answer's
end held until the whole passes; each step checked before it is streamed, ``coinfer.cloud.alone``).
Everything else is held by a client that cannot take text back (docs/api.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from coinfer import types as t
from coinfer.chat import refine_question, with_question
from coinfer.cloud.acceptance import cut_short, not_as_is
from coinfer.cloud.alone import CloudAlone
from coinfer.cloud.answer import Answer, draft_answer, join_steps, scaffolding_error, strip_candidate_label
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.context import SessionContext
from coinfer.cloud.judging import Judge
from coinfer.cloud.policy import consensus_prefix, mean_logprob, refine_max_tokens
from coinfer.cloud.ranking import Judged, Ranked
from coinfer.cloud.speculation import More, Proposal
from coinfer.cloud.writer import Writer, Written, never
from coinfer.tasks import OPEN, Parsed
from coinfer.tasks.base import split_steps

REFINE_LENGTH_FACTOR = 2
"""A refinement may write up to this many times the longest draft it refines (within the policy's
budget): it restates the draft's steps with room to correct them."""
REFINE_LENGTH_SLACK = 16
"""...plus this many tokens, so that a very short draft still leaves its refinement room to finish."""
MIN_CONSENSUS_SUPPORT = 2
"""Drafts (duplicates count) that must give the same answer for it to be what the drafts agree on."""


@dataclass(frozen=True, kw_only=True)
class _Checked:
    """A refinement checked (``Answerer._check_refinement``): its text, whether it may be the answer, why not,
    what the rules extracted, and whether it was refused only for contradicting what the drafts agree on."""

    text: str
    ok: bool
    why: str
    parsed: Parsed | None
    contradicts: bool = False


@dataclass(kw_only=True)
class RefinePlan:
    """How a refinement uses the drafts: its mode, the model prompt, the prefix it is forced to
    continue, and the drafts it is built from."""

    mode: t.RefineMode
    prompt: str
    prefix: str
    chosen: list[Judged]


class Answerer:
    """Answers one session from its ranked drafts (``answer``)."""

    def __init__(self, ctx: SessionContext, *, judge: Judge, stream: AnswerStream) -> None:
        self.ctx, self.judge, self.stream = ctx, judge, stream
        self.writer = Writer(ctx, stream)
        self.alone = CloudAlone(ctx, judge=judge, writer=self.writer, stream=stream)

    async def answer(self, ranked: Ranked, attempt: int = 0) -> Answer:
        """The answer once the drafts are in: the best verified draft as is (continued where it was cut
        short), a refinement of the drafts, or (no valid draft) the cloud's own. ``attempt``: the round
        the drafts came in (it names the refinement's engine requests)."""
        if not ranked:
            return await self.alone.answer()
        why = self.not_as_is(ranked)
        if not why and self.cut_short(ranked[0][0]):
            return await self._continued(ranked)
        if not why:
            return self._as_is(ranked)
        if self.ctx.own_over_candidates:
            return self._own_or_best(await self.alone.answer(why), ranked[0][0])
        return await self._refined(ranked, why, attempt)

    def _own_or_best(self, own: Answer, best: Judged) -> Answer:
        """The cloud's own answer where it passes the rules, else the best valid draft (never worse than it),
        where that draft keeps what was streamed as final; the own answer otherwise."""
        if own.valid or not best.draft.text.startswith(self.stream.final):
            return own
        a = draft_answer(best, t.RefineMode.ACCEPTED, f"{own.note}; the cloud's own answer failed: best draft returned")
        self.stream.replace(a.text, "the cloud's own answer failed: the best verified draft")
        a.ttft_ms, a.steps, a.generated = own.ttft_ms, own.steps, own.generated
        return a

    async def exact(
        self, proposals: Sequence[Proposal], more: More | None, later: AsyncIterator[Proposal] | None = None
    ) -> Answer:
        """Exact verification: the answer the cloud plan writes (``CloudAlone``), taking the drafts' tokens where
        they are the ones the target writes itself (``proposals``: the first round's drafts, the greedy one first;
        ``more``: the edge's drafts that continue the answer; ``later``: the first round's drafts still to come,
        for an engine that takes them inside the generation)."""
        a = await self.alone.answer(proposals=proposals, more=more, later=later)
        if proposals or (later is not None and self.ctx.engine.takes_drafts):
            a.mode, a.source = t.RefineMode.EXACT, t.AnswerSource.REFINED
            a.note = f"exact: the target's own answer, {a.accepted} draft tokens taken where it writes the same, {a.generated} decoded; {a.note}"
        return a

    def not_as_is(self, ranked: Ranked) -> str:
        """Why the best verified draft is not the answer as it stands ("": it is;
        ``coinfer.cloud.acceptance.not_as_is``). Where the rules decide, a draft that passed them is
        right: accepted."""
        if self.ctx.rules_decide:
            return ""
        best, _, agree = ranked[0]
        task, i = self.ctx.task, best.draft.index
        return not_as_is(
            self.ctx.policy,
            best,
            agree,
            free_text=task is OPEN and task.answer_key(best.parsed) is None,
            min_lp=self.judge.min_logprob(i),
            mean_lp=self.judge.mean_logprob(i),
        )

    def stands_alone(self, j: Judged) -> bool:
        """Whether valid draft ``j`` is the answer as it stands whatever drafts are still to come
        (``PolicyConfig.accept_first``): where the rules decide, or free text (an open request with nothing
        extracted: no agreement is asked of it) that the target finds about as likely as the draft model
        did, not cut at the draft budget. An answer drafts must agree on waits for the round."""
        if not j.verdict.valid or j.verdict.duplicate_of:
            return False
        if self.ctx.rules_decide:
            return True
        if not self.ctx.free_text or self.ctx.task.answer_key(j.parsed) is not None or self.cut_short(j):
            return False
        return not self.not_as_is([(j, 0.0, 1.0)])  # free text: no agreement is read

    def cut_short(self, best: Judged) -> bool:
        """The best draft was cut at the draft budget, short of the cloud's answer budget
        (``coinfer.cloud.acceptance.cut_short``). Not where the rules decide: the draft passed checkers
        that grade a whole answer, so it is one."""
        return not self.ctx.rules_decide and cut_short(best, self.ctx.answer_budget)

    def _as_is(self, ranked: Ranked) -> Answer:
        best, _, agree = ranked[0]
        self.stream.chunk(best.draft.text, final=True)
        if best.verdict.repaired:  # its text is the repaired one (``Judge._checked``)
            return draft_answer(
                best,
                t.RefineMode.REPAIRED,
                f"best draft accepted with its computed values repaired (as written: {best.verdict.repaired})",
            )
        return draft_answer(
            best,
            t.RefineMode.ACCEPTED,
            f"best draft accepted as is (score {best.verdict.score:.2f}, agreement {agree:.2f})",
        )

    async def _continued(self, ranked: Ranked) -> Answer:
        """A draft good enough to take as is but cut at the draft budget: the target continues it to the
        answer's own budget (the draft is the verified prefix; only the rest is decoded). A continuation
        that fails the rules (a loop) is dropped: the draft as it stands."""
        ctx = self.ctx
        best, _, agree = ranked[0]
        # the draft is final (a failed continuation returns it), its continuation is held
        w = await self.writer.write(
            ctx.prompt_text,
            best.draft.text,
            ctx.answer_budget - best.draft.num_tokens,
            "c",
            final=best.draft.text.startswith,
        )
        ok, why, parsed = await self.judge.recheck(w.text, likelihood=False)
        note = (
            f"best draft accepted as is (score {best.verdict.score:.2f}, agreement {agree:.2f}), "
            f"cut at its {best.draft.num_tokens}-token budget: continued by the target"
        )
        if ok:
            a = Answer(
                text=w.text,
                source=t.AnswerSource.REFINED,
                valid=True,
                parsed=parsed,
                chosen=[best],
                mode=t.RefineMode.PREFIX,
                finish=w.finish,
                note=note,
            )
        else:
            a = draft_answer(best, t.RefineMode.ACCEPTED, f"{note}; the continuation failed ({why}), draft returned")
            self.stream.replace(a.text, f"continuation rejected: {why}")
        a.ttft_ms, a.steps, a.generated = w.ttft_ms, w.tokens, w.tokens
        return a

    async def _refined(self, ranked: Ranked, not_as_is: str, attempt: int) -> Answer:
        """The target refines the drafts (a verified prefix continued, or candidates in the prompt); a
        refinement that fails the rules, leaks the template, is unlikely or contradicts what the drafts
        agree on is withdrawn and the best draft returned: never worse than the best valid draft. A
        candidates refinement that fails the rules gives the cloud's own answer instead, where that passes
        (``_own_instead``)."""
        best = ranked[0][0]
        plan = self.refine_plan(ranked)
        w = await self._write_refinement(plan, best, attempt)
        c = await self._check_refinement(ranked, plan, w, attempt)
        note = f"refined from {len(plan.chosen)} draft(s) as {plan.mode} (not as is: {not_as_is})"
        if c.ok:
            a = Answer(
                text=c.text,
                source=t.AnswerSource.REFINED,
                valid=True,
                parsed=c.parsed,
                chosen=plan.chosen,
                mode=plan.mode,
                finish=w.finish,
                note=note,
            )
        elif not c.contradicts and plan.mode is t.RefineMode.CANDIDATES and await self._fails_rules(c.text):
            return await self._own_instead(best, plan, note, c.why, w)
        else:
            a = self._best_instead(best, plan, note, c.why)
        a.ttft_ms, a.steps, a.generated = w.ttft_ms, w.tokens, w.tokens
        return a

    async def _write_refinement(self, plan: RefinePlan, best: Judged, attempt: int) -> Written:
        """The refinement streamed: final while it writes what the best draft says (a rejection returns that
        draft); a candidates refinement may lose a leading label once done, so none of it is final before then."""
        p = self.ctx.policy
        # latency-aware budget (docs/design.md §4.4), but never shorter than twice the longest draft used
        longest = max(j.draft.num_tokens for j in plan.chosen)
        max_tokens = max(
            refine_max_tokens(best.verdict.score, p.refine_max_tokens),
            min(p.refine_max_tokens, REFINE_LENGTH_FACTOR * longest + REFINE_LENGTH_SLACK),
        )
        same = best.draft.text.startswith if plan.mode is t.RefineMode.PREFIX else never
        return await self.writer.write(plan.prompt, plan.prefix, max_tokens, f"r{attempt}", same)

    async def _check_refinement(self, ranked: Ranked, plan: RefinePlan, w: Written, attempt: int) -> _Checked:
        """Whether the refinement ``w`` may replace the drafts: its text (a candidate's label dropped) free of
        the template's scaffolding, passing the rules and the threshold, and not contradicting agreeing drafts."""
        p, best = self.ctx.policy, ranked[0][0]
        text = w.text
        if plan.mode is t.RefineMode.CANDIDATES:
            text = strip_candidate_label(text, p.candidate_format, len(plan.chosen))
        if why := scaffolding_error(text, p.refine_template):
            return _Checked(text=text, ok=False, why=why, parsed=None)
        ok, why, parsed = await self.judge.recheck(
            text, than=self.judge.mean_logprob(best.draft.index), truncated=w.finish != t.FinishReason.STOP
        )
        if ok and (why := await self._refinement_error(ranked, text, parsed, attempt)):
            return _Checked(text=text, ok=False, why=why, parsed=parsed, contradicts=True)
        return _Checked(text=text, ok=ok, why=why, parsed=parsed)

    def _best_instead(self, best: Judged, plan: RefinePlan, note: str, why: str) -> Answer:
        """The refinement refused (``why``): the best draft, streamed in its place."""
        a = draft_answer(best, plan.mode, f"{note}; refinement rejected ({why}), best draft returned")
        a.chosen = plan.chosen
        self.stream.replace(a.text, f"refinement rejected: {why}")
        return a

    async def _own_instead(self, best: Judged, plan: RefinePlan, note: str, why: str, w: Written) -> Answer:
        """A candidates refinement ``w`` that failed the rules (``why``): the cloud's own answer where it passes
        (the cloud plan's answer, written aside and shown only then), else the best draft. A draft can pass every
        rule and still be wrong: on a demo words problem "Now she has 11 + 9 = 20" (21 given) passed the
        arithmetic rule at verifier score 0.63, its refinement copied the 11 and failed, and the draft was the
        answer (split 0.94-0.95 on words under load; docs/measurements.md, "A wrong answer found on the way").
        Not where the refinement only contradicted what the drafts agree on or was less likely than the draft
        (the draft is then the better evidence), nor after a prefix refinement (its shown text promised the best
        draft's)."""
        own = await self._own_answer()
        if own.valid:
            self.stream.replace(own.text, f"refinement rejected: {why}")  # nothing of the refinement was final
            own.note = "; ".join(
                n for n in (f"{note}; refinement rejected ({why}): the cloud answered itself", own.note) if n
            )
            own.steps += w.tokens
            own.generated += w.tokens
            return own
        a = self._best_instead(best, plan, note, f"{why}; the cloud's own answer failed too ({own.note or 'invalid'})")
        a.ttft_ms, a.steps, a.generated = w.ttft_ms, w.tokens + own.steps, w.tokens + own.generated
        return a

    async def _fails_rules(self, text: str) -> bool:
        """Whether ``text`` fails the rules in force (not only the likelihood threshold: a refinement the
        target finds less likely than the draft leaves the draft the better answer)."""
        res, _ = await asyncio.to_thread(self.ctx.rules.check, text)
        return not res.valid

    async def _own_answer(self) -> Answer:
        """The cloud's own answer written aside (nothing streamed): the session shows it only if it passes,
        else the best draft it would replace."""
        aside = AnswerStream()
        return await CloudAlone(self.ctx, judge=self.judge, writer=Writer(self.ctx, aside), stream=aside).answer()

    def refine_plan(self, ranked: Ranked) -> RefinePlan:
        """Continue a verified step prefix where the best draft is one the target itself finds likely,
        else refine from the best drafts as candidates."""
        ctx, p = self.ctx, self.ctx.policy
        best = ranked[0][0]
        if ctx.task is not OPEN and p.consensus_prefix and best.verdict.score >= p.prefix_min_score:
            # A fixed prefix only where the target finds the best draft likely: a low score means
            # the target would not write those steps, and forcing them steers it down the
            # draft's (wrong) path. Duplicates from a confident small model are support, not
            # independent evidence.
            steps = [split_steps(j.draft.text) for j, _, _ in ranked for _ in range(j.support)]
            prefix_steps = consensus_prefix(steps, min(p.min_support, len(steps)))
            if prefix_steps:
                return RefinePlan(
                    mode=t.RefineMode.PREFIX, prompt=ctx.prompt_text, prefix=join_steps(prefix_steps), chosen=[best]
                )
        chosen = [j for j, _, _ in ranked[: p.context_drafts]]  # duplicates were merged at verification
        question = refine_question(
            ctx.req.question, [j.draft.text for j in chosen], p.refine_template, p.candidate_format
        )
        prompt = ctx.engine.render(with_question(ctx.req.conversation, question))
        return RefinePlan(mode=t.RefineMode.CANDIDATES, prompt=prompt, prefix="", chosen=chosen)

    def _agreement_key(self, text: str, parsed: Parsed | None) -> object:
        """What two answers must share to agree: the extracted answer, else the text (whitespace aside)."""
        key = self.ctx.task.answer_key(parsed) if parsed is not None and parsed.ok else None
        return key if key is not None else " ".join(text.split())

    def consensus(self, ranked: Ranked) -> object | None:
        """The answer every verified draft gives, when >= ``MIN_CONSENSUS_SUPPORT`` drafts (duplicates
        count) give it; else None."""
        keys = {self._agreement_key(j.draft.text, j.parsed) for j, _, _ in ranked}
        support = sum(j.support for j, _, _ in ranked)
        return keys.pop() if len(keys) == 1 and support >= MIN_CONSENSUS_SUPPORT else None

    async def _refinement_error(self, ranked: Ranked, text: str, parsed: Parsed, attempt: int) -> str:
        """Why a refinement that passed the rules must still not replace the drafts: it contradicts
        what the drafts agree on and the target does not clearly prefer it
        (``PolicyConfig.refine_override_nats``)."""
        ctx, p = self.ctx, self.ctx.policy
        agreed = self.consensus(ranked)
        if agreed is None or self._agreement_key(text, parsed) == agreed:
            return ""
        best_mean = self.judge.mean_logprob(ranked[0][0].draft.index)
        if p.verifier == t.VerifierKind.LIKELIHOOD and best_mean is not None:
            lps = await ctx.engine.continuation_logprobs(ctx.prompt_text, text, ctx.request_id(f"o{attempt}"))
            mean, floor = mean_logprob(lps), best_mean + p.refine_override_nats
            if lps and mean >= floor:
                return ""
            return (
                f"contradicts: the drafts agree and the target prefers them (refinement mean logprob "
                f"{mean:.2f} < {floor:.2f} per token)"
            )
        return "contradicts: the drafts agree on another answer"
