"""The cloud's own answer, when no draft is valid (or none was sent: the cloud plan). The target
continues from the steps the drafts got right before their first mistake (most common path first);
its greedy answer is not held to the likelihood threshold (it is the target's most likely answer);
when it fails a rule, a wrong computed value is corrected and the answer continued, then sampled
candidates are checked (docs/design.md §2.2).

Where only the loop watch can refuse the answer (``RuleSet.only_loop_watch``), it streams as final and
is kept whatever follows: no correction, no candidates (they would withdraw it); a loop is cut, not
replaced.

Where the rules can judge its steps (``RuleSet.streams_steps``: every rule judges a prefix; or a preset's
steps before its ``answer ...``, an open request's text before its extraction's marker, where the other
rules read only the end), it streams as final step by step (``_stepwise``): each step is checked before it
is shown, a failed step is never shown, and the target continues from the last good step, a wrong
computed value corrected where the failure is one, else sampled anew; the answer's end is held until the
whole answer passes, and sampled anew from the last step shown where it does not; so everything streamed
begins the answer. Where a preset's calculator can end it (``RuleSet.step_completion``), a step streams as
it grows; a step that then fails is ended by the calculator from what was shown (``_end_shown_step``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from coinfer import types as t
from coinfer.cloud.answer import Answer, finish_reason, join_steps
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.context import SessionContext
from coinfer.cloud.judging import Judge
from coinfer.cloud.policy import consensus_prefix
from coinfer.cloud.speculation import More, Proposal
from coinfer.cloud.writer import Writer, Written, always, never, shown_step_start
from coinfer.steps import STEP_ENDS
from coinfer.tasks import OPEN
from coinfer.tasks.base import split_steps

NO_DRAFTS = "no drafts (cloud plan): the cloud answered alone"
"""How the note of an answer written with no draft judged begins (``CloudAlone``'s ``no_drafts``)."""
ONE_DRAFT = 1
"""Support a step needs to join the prefix the cloud continues: one draft's verified step is right."""


@dataclass(kw_only=True)
class _Tries:
    """A step-by-step answer's generations so far (``CloudAlone._stepwise``): its corrections and samples,
    what each said, the tokens decoded and those taken from drafts."""

    fixes: int = 0
    samples: int = 0
    notes: list[str] = field(default_factory=list)
    tokens: int = 0
    accepted: int = 0

    def took(self, w: Written) -> None:
        """Count generation ``w``'s tokens."""
        self.tokens += w.tokens - w.accepted
        self.accepted += w.accepted


class CloudAlone:
    """The cloud's own answer for one session (``answer``)."""

    def __init__(
        self, ctx: SessionContext, *, judge: Judge, writer: Writer, stream: AnswerStream, no_drafts: str = NO_DRAFTS
    ) -> None:
        """``no_drafts``: how the answer's note begins where no draft was judged (``coinfer.cloud.hedge``: why)."""
        self.ctx, self.judge, self.writer, self.stream = ctx, judge, writer, stream
        self.no_drafts = no_drafts
        self.proposals: Sequence[Proposal] = ()
        self.more: More | None = None
        self.later: AsyncIterator[Proposal] | None = None
        self.draft_valid = False
        """A valid draft answers where this answer fails (``SessionContext.own_over_candidates``): no unchecked
        text of its own is streamed then."""

    def _write(self, *args, **kwargs) -> Awaitable[Written]:
        """``Writer.write`` offered the drafts' tokens (exact verification; none otherwise): a greedy generation
        takes those it would write itself, and is the same text (``coinfer.cloud.speculation``)."""
        later, self.later = self.later, None  # the drafts still to come go to the first generation
        return self.writer.write(*args, proposals=self.proposals, more=self.more, later=later, **kwargs)

    def _room(self, prefix: str) -> int:
        """The tokens the answer may still add after ``prefix``: the whole answer stays within the request's
        budget however many times it is continued from a corrected step."""
        return max(0, self.ctx.answer_budget - self.ctx.engine.count_tokens(prefix))

    async def answer(
        self,
        not_as_is: str = "",
        *,
        proposals: Sequence[Proposal] = (),
        more: More | None = None,
        later: AsyncIterator[Proposal] | None = None,
    ) -> Answer:
        """The cloud's answer, from the steps the drafts judged so far got right. ``not_as_is``: why the best
        valid draft was not the answer (``SessionContext.own_over_candidates``; '': no draft was valid).
        ``proposals`` / ``more``: drafts of the whole answer whose tokens the target takes where it writes
        the same (exact verification: then no draft's steps are continued, the answer being the target's own);
        ``later``: drafts still to come, sent to the first generation on an engine that takes drafts inside it."""
        ctx, p = self.ctx, self.ctx.policy
        self.proposals, self.more, self.later = proposals, more, later
        self.draft_valid = bool(not_as_is)  # a valid draft is the caller's answer where this one fails
        drafts = [j.draft.text for j in self.judge.judged.values()]
        verified = [] if proposals else await asyncio.to_thread(lambda: [self._prefix_steps(text) for text in drafts])
        prefix_steps = consensus_prefix([v for v in verified if v], ONE_DRAFT)
        prefix = join_steps(prefix_steps)
        if ctx.rules.streams_steps and not ctx.rules.only_loop_watch:
            a = await self._stepwise(prefix)
            a.mode = t.RefineMode.PREFIX if prefix_steps else t.RefineMode.ALONE
            return self._noted(a, drafts, prefix_steps, not_as_is)
        commit = ctx.rules.only_loop_watch  # only the loop watch can refuse it: final as it streams
        w = await self._write(ctx.prompt_text, prefix, p.refine_max_tokens, "cloud", always if commit else never)
        valid, why, parsed = await self.judge.recheck(w.text, likelihood=False)
        a = Answer(
            text=w.text,
            source=t.AnswerSource.CLOUD,
            valid=valid,
            parsed=parsed,
            mode=t.RefineMode.PREFIX if prefix_steps else t.RefineMode.ALONE,  # a verified prefix is the drafts' work
            finish=w.finish,
            note="streamed as final: a loop cut" if w.finish == t.FinishReason.REPETITION and commit else "",
            ttft_ms=w.ttft_ms,
            steps=w.tokens - w.accepted,
            generated=w.tokens - w.accepted,
            accepted=w.accepted,
        )
        if not valid and p.calculator_fixes and not commit:
            why = await self._calculator_fixed(a, why)
        if not a.valid and p.cloud_candidates > 0 and not commit:
            # candidates continue from the greedy answer's own steps before its first mistake (right
            # steps kept, fewer tokens decoded: select's candidates cost 0.6x)
            own = ctx.task.verified_prefix(ctx.spec, a.text)
            await self._candidates(a, join_steps(own) if len(own) > len(prefix_steps) else prefix, why)
        return self._noted(a, drafts, prefix_steps, not_as_is)

    def _noted(self, a: Answer, drafts: list[str], prefix_steps: list[str], not_as_is: str = "") -> Answer:
        """``a`` with its note saying where the cloud's answer came from."""
        why = f"best draft not as is ({not_as_is})" if not_as_is else "no valid draft after retries"
        a.note = (
            (f"{why}: cloud answered alone from {len(prefix_steps)} verified steps" if drafts else self.no_drafts)
            + (f"; {a.note}" if a.note else "")
            + ("" if a.valid else " (its answer failed verification)")
        )
        return a

    async def _stepwise(self, prefix: str) -> Answer:
        """The cloud's answer step by step (``Writer.write``'s ``check``): each step the rules pass streams
        as final; at the first that fails, the target continues from the last good step, the failed
        step's wrong computed value corrected (up to ``calculator_fixes``) or else sampled anew (up to
        ``cloud_candidates``, seeded: the same request ends on the same text). When the generation ends,
        what follows the last step is checked with the whole answer and streamed if it passes. An answer
        that stops (its budget, ``max_chars``, a loop) where every rule judges a prefix, or that runs out
        of tries, ends at its last good step: what was shown. Where the rules need the answer's end (held:
        a preset's ``answer ...``, an extraction's marker), an answer that stopped without a passing end
        is sampled anew from the last step shown, as a failed step is."""
        ctx, p, rules = self.ctx, self.ctx.policy, self.ctx.rules
        write = functools.partial(
            self._write, ctx.prompt_text, check=rules.prefix_error, max_chars=rules.max_chars, grow=rules.step_shown
        )
        w = await write(prefix, p.refine_max_tokens, "cloud")
        ttft, tries = w.ttft_ms, _Tries()
        tries.took(w)
        while True:
            why = w.error
            if not why:  # the generation ended: the rest is checked with the whole answer
                ended, why = await self._whole_checked(w, tries)
                if ended:
                    break
            if (again := await self._step_again(write, w, why, tries)) is None:
                break
            w = again
            tries.took(w)
        return await self._stepwise_answer(w, ttft, tries)

    async def _whole_checked(self, w: Written, tries: _Tries) -> tuple[bool, str]:
        """A step-by-step generation ``w`` that ended, checked whole: (whether the answer ends here, why it fails).
        It ends where it passes (what follows its last step streamed), or where it stopped (its budget,
        ``max_chars``, a loop) and every rule judges a prefix: its last good step ends it."""
        valid, why, _ = await self.judge.recheck(w.text, likelihood=False)
        if valid and w.finish is not t.FinishReason.REPETITION:
            if rest := w.text[len(self.stream.shown) :]:
                self.stream.chunk(rest, final=True)
            return True, why
        if w.finish is not t.FinishReason.STOP and self.ctx.rules.judges_prefix:  # no end is held
            tries.notes.append(f"cut at its last good step ({w.finish.value})")
            return True, why
        return False, why

    async def _step_again(
        self, write: Callable[..., Awaitable[Written]], w: Written, why: str, tries: _Tries
    ) -> Written | None:
        """After a failed step (or a failed end) of ``w``: the target continues from the last good step, the
        failed step's wrong computed value corrected (a step shown as it grew: ended by the calculator), else
        sampled anew; None once the tries are spent."""
        ctx, p = self.ctx, self.ctx.policy
        fixing = tries.fixes < p.calculator_fixes
        if ended := await self._end_shown_step():  # shown as it grew: the calculator ends it
            tries.notes.append(f"a step begun as shown ended by the calculator ({why})")
            fixed = self.stream.shown if fixing else None
        else:
            fixed = await asyncio.to_thread(ctx.task.corrected_prefix, ctx.spec, w.text) if fixing else None
        if fixed is not None and fixed.startswith(self.stream.shown):
            tries.fixes += 1
            if not ended:
                tries.notes.append(f"a computed value corrected ({why})")
            return await write(fixed, self._room(fixed), f"fix{tries.fixes}")
        if tries.samples < p.cloud_candidates:
            tries.samples += 1
            tries.notes.append(f"a step resampled ({why})")
            params, room = ctx.params(p.refine_max_tokens), self._room(self.stream.shown)
            seed = (params.seed or 0) + tries.samples  # seeded: the same request ends on the same text
            sampled = dataclasses.replace(params, temperature=p.cloud_temperature, seed=seed, max_tokens=room)
            return await write(self.stream.shown, room, f"step{tries.samples}", params=sampled)
        tries.notes.append(f"ended at its last good step: no continuation passed ({why})")
        return None

    async def _stepwise_answer(self, w: Written, ttft: float, tries: _Tries) -> Answer:
        """The step-by-step answer once its tries end (``w``: the last): what the stream shows."""
        unverified = not self.stream.shown.strip() and bool(w.text.strip()) and not self.draft_valid
        if unverified:
            # not one step passed and no draft is valid: the last try, through the step that failed, rather
            # than no text at all (what the cloud answered before it streamed steps: its own answer, invalid)
            tries.notes.append("no step passed: its last try, unverified")
            self.stream.chunk(w.text, final=True)
        text = self.stream.shown
        valid, _, parsed = await self.judge.recheck(text, likelihood=False)
        return Answer(
            text=text,
            source=t.AnswerSource.CLOUD,
            valid=valid and not unverified and bool(text.strip()),  # no good step at all is no answer
            parsed=parsed,
            mode=t.RefineMode.ALONE,
            finish=w.finish,
            note="streamed as final step by step" + "".join(f"; {n}" for n in tries.notes),
            ttft_ms=ttft,
            steps=tries.tokens,
            generated=tries.tokens,
            accepted=tries.accepted,
        )

    async def _end_shown_step(self) -> bool:
        """Where the stream shows a step begun (it streamed as it grew, ``Writer.write``'s ``grow``)
        and the model did not end it rightly, the calculator's end of it streamed, with the separator
        the answer's steps end with (``;`` where none has ended): whether there was one to end."""
        shown, rules = self.stream.shown, self.ctx.rules
        start = shown_step_start(shown)
        begun = shown[start:]
        rest = rules.step_completion(begun) if begun.strip() else None
        if rest is None:
            return False
        sep = shown[start - 1] if start and shown[start - 1] in STEP_ENDS else ";"
        if await asyncio.to_thread(rules.prefix_error, shown + rest + sep) != "":  # never: a right step
            return False
        self.stream.chunk(rest + sep, final=True)
        return True

    def _prefix_steps(self, text: str) -> list[str]:
        """A draft's steps before its first mistake, and that step corrected where its mistake is a
        computed value (``Task.corrected_prefix``: the subset or operands stay the draft's). Tasks only:
        a word problem's draft carries its plan in prose, which nothing here checks. With
        ``PolicyConfig.repair_drafts`` (and ``calculator_fixes``), the steps are the draft's repaired ones (``Task.repaired``: every
        computed value rewritten in place), up to the first the task still refuses (a select draft's
        wrong choice leaves every listed subset a right step: the target writes only the answer; held-out
        select, ``python -m benchmarks.capacity``: 114 engine tokens per split answer before, 11 after)."""
        task, spec, p = self.ctx.task, self.ctx.spec, self.ctx.policy
        if task is OPEN or not p.calculator_fixes:  # no calculator: the steps as the draft wrote them
            return task.verified_prefix(spec, text)
        if p.repair_drafts:
            text = task.repaired(spec, text) or text
        ok = task.verified_prefix(spec, text)
        fixed = task.corrected_prefix(spec, text)
        steps = split_steps(fixed) if fixed else []
        # the corrected step must be one the task verifies (arith: a step of the expression; a draft's
        # right arithmetic on the wrong terms, corrected, is still the wrong step: held-out prefix
        # answers fell from 0.96 to 0.71 right without this)
        if len(steps) == len(ok) + 1 and steps[: len(ok)] == ok and task.step_ok(spec, steps[-1]):
            return steps
        return ok

    async def _calculator_fixed(self, a: Answer, why: str) -> str:
        """The cloud's answer ``a`` failed the rules (``why``): where a computed value is wrong (an
        ``a op b = c``, a task step's sum), the true value replaces it (``Task.corrected_prefix``) and
        the target continues from there, up to ``calculator_fixes`` times; ``a`` is updated in place.
        Returns why the last answer still fails ('' when it passes)."""
        ctx = self.ctx
        for n in range(ctx.policy.calculator_fixes):
            fixed = await asyncio.to_thread(ctx.task.corrected_prefix, ctx.spec, a.text)  # linear in the text
            if fixed is None:
                break
            self.stream.withdraw(f"the cloud's answer failed {why}: a computed value corrected")
            w = await self._write(ctx.prompt_text, fixed, self._room(fixed), f"fix{n}")
            a.steps, a.generated = a.steps + w.tokens - w.accepted, a.generated + w.tokens - w.accepted
            a.accepted += w.accepted
            a.valid, why, a.parsed = await self.judge.recheck(w.text, likelihood=False)
            a.text, a.finish = w.text, w.finish
            if a.valid:
                a.note = f"{n + 1} computed value(s) corrected"
                return ""
        return why

    async def _candidates(self, a: Answer, prefix: str, why: str) -> None:
        """Sample ``cloud_candidates`` answers in one batched request; each is checked as it finishes
        and the first that passes the rules replaces ``a``'s text, the others aborted (SmolLM2's haiku:
        one of 4 candidates looped to its 192-token budget while the other three ended by token 35)."""
        ctx, p = self.ctx, self.ctx.policy
        cands = ctx.engine.finished_samples(
            ctx.prompt_text + prefix,
            dataclasses.replace(ctx.params(p.refine_max_tokens), temperature=p.cloud_temperature, seed=None),
            p.cloud_candidates,
            ctx.request_id("cands"),
        )
        done, last = 0, 0
        async with contextlib.aclosing(cands):
            async for cand in cands:
                done, last = done + 1, cand.tokens
                a.generated += cand.tokens
                ok, _, parsed = await self.judge.recheck(prefix + cand.text, likelihood=False)
                if ok:
                    self.stream.replace(prefix + cand.text, f"the cloud's answer failed {why}; a candidate passed")
                    a.text, a.valid, a.parsed = prefix + cand.text, True, parsed
                    a.finish = finish_reason(cand.finish_reason)
                    break
        # one batched request: its steps are the last finished candidate's tokens, and each candidate
        # aborted then had decoded as many (they advance in lockstep)
        a.steps += last
        a.generated += (p.cloud_candidates - done) * last
