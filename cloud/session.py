"""One co-inference session: verify drafts as they arrive, then refine (docs/design.md §2.2).

This file holds the session's stream and its driver (rounds of drafts, retry advice, the
deadline); verification and ranking are ``coinfer.cloud.judging``, the answer paths
``coinfer.cloud.answering``, the state they share ``coinfer.cloud.session_state``.

Input: the edge's drafts and end-of-round markers (an async iterator).
Output: domain events (``coinfer.types``) in the order the edge should see them:
``SessionAccepted``, a ``Verdict`` per draft as soon as it is judged, then either
``AnswerChunk``s and a ``Summary``, or ``RetryAdvice`` and another round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from coinfer import types as t
from coinfer.cloud.answering import Answer, Answering
from coinfer.cloud.judging import Judging
from coinfer.cloud.session_state import Ranked
from coinfer.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, field_of

log = logging.getLogger(__name__)


@dataclass
class DraftsDone:
    """End of a round of drafts (``count`` drafts were sent in it)."""

    count: int


EdgeItem = t.Draft | DraftsDone
_END = object()


@dataclass
class Session(Judging, Answering):
    """One session (its state: ``SessionState``); ``run`` drives it."""

    def _ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    async def _finish(self, out: asyncio.Queue, verify_ms: float) -> None:
        """The session's answer once the drafts are in: the best verified draft as is, a refinement
        of the drafts, or (no valid draft) the cloud's own answer; then the Summary."""
        ranked = self._ranked()
        t_ref = time.perf_counter()
        not_as_is = self._accept_as_is(ranked) if ranked else ""
        if ranked and not not_as_is and self._cut_short(ranked[0][0]):
            a = await self._answer_continued(ranked, out)
        elif ranked and not not_as_is:
            a = await self._answer_as_is(ranked, out)
        elif ranked:
            a = await self._answer_refined(ranked, not_as_is, out)
        else:
            a = await self._answer_alone(out)
        if self.cfg.policy.learn_every:  # grading every draft only feeds the learner; parses client text: off the loop
            await asyncio.to_thread(self._outcome, ranked, a.text)
        await out.put(
            self._summary(
                ranked,
                a,
                t.Timings(verify_ms, a.ttft_ms, (time.perf_counter() - t_ref) * 1e3, self._ms(), a.steps, a.generated),
            )
        )

    async def _chunk(self, out: asyncio.Queue, text: str, final: bool = False) -> None:
        """Stream ``text``; ``final``: every answer the session can still end on begins with what was
        streamed so far, this included (``coinfer.cloud.answering``'s docstring says where)."""
        self.shown += text
        await out.put(t.AnswerChunk(text, final))

    async def _withdraw(self, out: asyncio.Queue, reason: str) -> None:
        """Withdraw what was streamed (``AnswerReset``): the answer will be streamed anew."""
        if self.shown:
            self.shown = ""
            await out.put(t.AnswerReset(reason))

    async def _replace_streamed(self, out: asyncio.Queue, answer: str, reason: str) -> None:
        """The answer is not the text streamed: withdraw it (``AnswerReset``) and stream the answer,
        so that a client showing chunks as they come ends on the answer the Summary carries."""
        if self.shown == answer:
            return
        await self._withdraw(out, reason)
        await self._chunk(out, answer, final=True)  # decided: this is the answer

    def _summary(self, ranked: Ranked, a: Answer, timings: t.Timings) -> t.Summary:
        rank_of = {j.draft.index: r for j, r, _ in ranked}
        scores = [
            t.DraftScore(i, j.verdict.valid, j.verdict.score, rank_of.get(i, 0.0))
            for i, j in sorted(self.judged.items())
        ]
        trace = (
            "; ".join(
                f"Draft#{j.draft.index} "
                + (
                    f"scored {j.verdict.score:.2f}, passed {','.join(j.verdict.rules_passed)}"
                    if j.verdict.valid
                    else f"failed {j.verdict.failed_rule}: {j.verdict.error}"
                )
                for j in self.judged.values()
            )
            + f" | {a.note}"
        )
        return t.Summary(
            answer=a.text,
            source=a.source,
            chosen_drafts=[j.draft.index for j in a.chosen],
            scores=scores,
            timings=timings,
            trace=f"[THINKING_TRACE: {trace}]",
            answer_valid=a.valid,
            recommended_drafts=self.recommended_drafts,
            request_id=self.req.request_id,
            refine_mode=a.mode,
            fields=dict(a.parsed.fields) if a.parsed is not None and a.parsed.ok else {},
            prompt_tokens=self.engine.count_tokens(self.prompt_text),
            answer_tokens=self.engine.count_tokens(a.text),
            finish_reason=a.finish,
        )

    def _at_deadline(self) -> t.Summary | None:
        """The best answer the session has when its deadline expires mid-work (refinement, retries,
        candidates): the best verified draft, as is; None when no draft was verified valid. The
        deadline bounds the wait: an answer before it, never a better one after."""
        ranked = self._ranked()
        if not ranked:
            return None
        a = self._draft_answer(
            ranked[0][0], t.RefineMode.DEADLINE, "deadline reached: the best verified draft returned as is"
        )
        return self._summary(ranked, a, t.Timings(total_ms=self._ms()))

    def _advice(self) -> t.RetryAdvice:
        errors: dict[str, int] = {}
        for j in self.judged.values():
            if not j.verdict.valid:
                code = field_of(j.verdict.error)
                errors[code] = errors.get(code, 0) + 1
        reason = ", ".join(f"{k} x{n}" for k, n in sorted(errors.items(), key=lambda kv: -kv[1])) or "no drafts"
        # explore more each round: hotter, more diverse, a few more drafts
        base = t.SamplingParams()
        sampling = t.SamplingParams(
            temperature=min(1.5, base.temperature + 0.3 * self.attempt),
            top_p=base.top_p,
            presence_penalty=min(2.0, base.presence_penalty + 0.2 * self.attempt),
            frequency_penalty=min(2.0, base.frequency_penalty + 0.1 * self.attempt),
            max_new_tokens=base.max_new_tokens,
        )
        n = min(self.cfg.limits.max_drafts - len(self.seen), self.recommended_drafts + 2 * self.attempt)
        return t.RetryAdvice(self.attempt, n, sampling, reason)

    @property
    def _kind(self) -> tuple:
        """What rounds of drafts are counted by (``RoundOdds``): the task and the rules in force."""
        return self.req.task, tuple(self.rules.labels)

    def _another_round_pays(self) -> bool:
        """Whether another round of drafts is worth its wait: rounds of this kind of request lately held a
        valid draft often enough (``PolicyConfig.min_round_odds``)."""
        return self.round_odds is None or self.round_odds.pays(self._kind, self.cfg.policy.min_round_odds)

    # ---- driver ---------------------------------------------------------------------
    async def _consume(self, inbox: AsyncIterator[EdgeItem], out: asyncio.Queue) -> None:
        round_tasks: list[asyncio.Task] = []
        pending: dict[tuple, asyncio.Future] = {}

        async def verify_and_emit(d: t.Draft) -> None:
            await out.put(await self._verify(d, pending))

        try:
            await self._rounds(inbox, out, round_tasks, pending, verify_and_emit)
        finally:  # a cancelled or failed session stops its verifications (and their vLLM requests)
            for tk in round_tasks:
                tk.cancel()
            await asyncio.gather(*round_tasks, return_exceptions=True)

    async def _rounds(
        self,
        inbox: AsyncIterator[EdgeItem],
        out: asyncio.Queue,
        round_tasks: list[asyncio.Task],
        pending: dict,
        verify_and_emit,
    ) -> None:
        lim = self.cfg.limits
        sent_in_round = 0
        async for item in inbox:
            if isinstance(item, t.Draft):
                if item.index in self.seen:
                    raise InvalidArgument(f"draft.index: {item.index} was already sent")
                if len(item.text) > lim.max_draft_chars:
                    raise ResourceExhausted(f"draft.text: {len(item.text)} chars > limit {lim.max_draft_chars}")
                if len(self.seen) >= lim.max_drafts:
                    raise ResourceExhausted(f"draft: more than {lim.max_drafts} drafts in one session")
                self.seen.add(item.index)
                round_tasks.append(asyncio.create_task(verify_and_emit(item), name=f"d{item.index}"))
                sent_in_round += 1
                continue
            if item.count != sent_in_round:
                raise InvalidArgument(f"done.count: {item.count} but {sent_in_round} drafts were sent this round")
            await asyncio.gather(*round_tasks)
            verify_ms = self._ms()
            round_tasks.clear()
            sent_in_round = 0
            budget_left = self.cfg.limits.max_drafts - len(self.seen)
            found = bool(self._ranked())
            if self.round_odds is not None:
                self.round_odds.observe(self._kind, found)
            if (
                found
                or self.attempt >= self.cfg.policy.max_retries
                or budget_left < 1
                or not self._another_round_pays()
            ):
                await self._finish(out, verify_ms)
                return
            self.attempt += 1
            await out.put(self._advice())
        # the edge closed its side without finishing a round: answer from what we have
        await asyncio.gather(*round_tasks)
        await self._finish(out, self._ms())

    async def run(self, inbox: AsyncIterator[EdgeItem]) -> AsyncIterator[t.CloudEvent]:
        out: asyncio.Queue = asyncio.Queue()
        yield t.SessionAccepted(self.req.request_id, self.rules.labels, self.recommended_drafts)

        async def consume() -> None:
            try:
                async with asyncio.timeout(self.deadline_s):
                    await self._consume(inbox, out)
                await out.put(_END)
            except TimeoutError:
                best = self._at_deadline()
                if best is not None:  # what was streamed of an unfinished refinement is not the answer
                    await self._replace_streamed(out, best.answer, "deadline: the best verified draft, as is")
                await out.put(
                    best
                    if best is not None
                    else DeadlineExceeded(
                        f"deadline_ms: session exceeded its {self.deadline_s * 1e3:.0f} ms deadline with no verified draft"
                    )
                )
                if best is not None:
                    await out.put(_END)
            except BaseException as exc:  # hand every failure to the reader below
                await out.put(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

        task = asyncio.create_task(consume())
        try:
            while True:
                ev = await out.get()
                if ev is _END:
                    return
                if isinstance(ev, BaseException):
                    raise ev
                yield ev
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
