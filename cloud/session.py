"""One co-inference session: verify drafts as they arrive, then answer (docs/design.md §2.2).

``Session`` coordinates its parts, each in a file of its own: the judge turns drafts into verdicts
(``coinfer.cloud.judging.Judge``), the answerer turns the ranked verdicts into an answer
(``coinfer.cloud.answering.Answerer``), the answer stream owns what the client was shown
(``coinfer.cloud.answer_stream.AnswerStream``); the session drives the rounds of drafts
(``coinfer.cloud.rounds``), the retry advice and the deadline, and ends on the Summary.

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
from coinfer.cloud.answer import Answer, draft_answer
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.answering import Answerer
from coinfer.cloud.config import CloudConfig
from coinfer.cloud.context import SessionContext
from coinfer.cloud.engine import TargetEngine
from coinfer.cloud.hedge import Hedge
from coinfer.cloud.judging import Judge
from coinfer.cloud.learning import Outcome, outcome_rows
from coinfer.cloud.policy import RoundOdds, retry
from coinfer.cloud.ranking import MS_PER_S, Judged, Ranked
from coinfer.cloud.rounds import Rounds, request_kind, retry_advice
from coinfer.cloud.summary import summary
from coinfer.errors import DeadlineExceeded
from coinfer.rules import RuleSet
from coinfer.tasks import Task

log = logging.getLogger(__name__)


@dataclass
class DraftsDone:
    """End of a round of drafts (``count`` drafts were sent in it)."""

    count: int


EdgeItem = t.Draft | DraftsDone

ACCEPTED_FIRST = "a draft before it was accepted as is"
"""Why the drafts after one that stood as is are not scored (``PolicyConfig.accept_first``)."""


class Session:
    """One session over its parts; ``run`` drives it."""

    def __init__(
        self,
        *,
        cfg: CloudConfig,
        engine: TargetEngine,
        req: t.OpenRequest,
        task: Task,
        spec: dict,
        rules: RuleSet,
        recommended_drafts: int,
        deadline_s: float,
        weights: tuple[float, float, float] | None = None,
        load: float = 0.0,
        round_odds: RoundOdds | None = None,
        drafting: bool = True,
    ) -> None:
        """``weights``: the scheduler weights (a, b, g) in force (None: the configured ones); ``load``: the
        engine's at open (raises the latency weight, and no hedge at heavy load); ``round_odds``: the
        service's record of how often a round of drafts holds a valid one (None: retry as configured, no
        hedge); ``drafting``: drafts may come (False: the cloud plan, which answers alone anyway)."""
        self.ctx = SessionContext(cfg=cfg, engine=engine, req=req, task=task, spec=spec, rules=rules)
        # rendered now: a conversation the target cannot read (a request in chat form and no chat template, or
        # one its template refuses) is the open's error (INVALID_ARGUMENT naming why), before any draft is taken
        self.ctx.prompt_text  # noqa: B018 - cached for the session's parts
        self.recommended_drafts, self.deadline_s, self.round_odds = recommended_drafts, deadline_s, round_odds
        self.stream = AnswerStream()
        self.judge = Judge(self.ctx, weights=weights, load=load)
        self.answerer = Answerer(self.ctx, judge=self.judge, stream=self.stream)
        self.rounds = Rounds(cfg.limits)
        self.load, self.drafting = load, drafting
        self.hedge: Hedge | None = None
        """The cloud's own answer racing the drafts (``coinfer.cloud.hedge``), begun when the session runs."""
        self._finishing = False
        """The session is answering: a hedge that wins now does not cut it short."""
        self._first: Judged | None = None
        """The first draft that stood as is (``PolicyConfig.accept_first``); ``_accepted`` is set with it
        (an event, not a future: a session may be built before its loop runs)."""
        self._accepted = asyncio.Event()
        self.outcome: list[Outcome] = []
        """(score, agreement, latency_s, label) per ranked draft once finished: the learner's input."""
        self.t0 = time.perf_counter()

    def _ms(self) -> float:
        return (time.perf_counter() - self.t0) * MS_PER_S

    @property
    def kind(self) -> tuple:
        """What rounds of drafts of this request are counted by (``RoundOdds``)."""
        return request_kind(self.ctx.req, self.ctx.rules)

    def _observe(self, found: bool) -> None:
        """Count the round that ended: a first round under the request's kind, a retry round apart (``retry``)."""
        if self.round_odds is not None and (self.hedge is None or self.ctx.rules_decide):
            # a round whose drafts were not scored (a hedge answered) tells nothing
            self.round_odds.observe(self.kind if self.rounds.attempt == 0 else retry(self.kind), found)

    def _hedges(self) -> bool:
        """Whether to begin the cloud's own answer at open (``PolicyConfig.hedge_below_odds``): drafts may
        come, rounds of this kind rarely hold a valid one, and the engine is not heavily loaded."""
        p = self.ctx.policy
        return (
            self.drafting
            and self.round_odds is not None
            and self.load < p.hedge_max_load
            and self.round_odds.hopeless(self.kind, p.hedge_below_odds)
        )

    def _skip_scoring(self) -> None:
        """With a hedge under way, the drafts its round held that await the LLM verifier get their verdict
        now, unscored (``Judge.skip_scoring``): the session answers with the hedge unless the rules alone
        passed a draft where they decide."""
        if self.hedge is not None:
            self.judge.skip_scoring(
                f"the cloud answered itself: rounds of this kind held a valid draft {self.hedge.odds:.0%} of the time lately"
            )

    def _another_round_pays(self) -> bool:
        """Whether another round of drafts is worth its wait: rounds of this kind of request lately held a
        valid draft often enough (``PolicyConfig.min_round_odds``), and not so rarely that the cloud would
        not wait for the first (``hedge_below_odds``: a round it does wait for then only explores)."""
        odds, p = self.round_odds, self.ctx.policy
        if odds is None:
            return True
        return not odds.rare(self.kind, p.hedge_below_odds) and odds.pays(self.kind, p.min_round_odds)

    def _summary(self, ranked: Ranked, a: Answer, timings: t.Timings) -> t.Summary:
        engine = self.ctx.engine
        return summary(
            req=self.ctx.req,
            judged=self.judge.judged,
            ranked=ranked,
            answer=a,
            timings=timings,
            recommended_drafts=self.recommended_drafts,
            prompt_tokens=engine.count_tokens(self.ctx.prompt_text),
            answer_tokens=engine.count_tokens(a.text),
        )

    async def _finish(self, verify_ms: float, hedged: bool = False, accepted: Judged | None = None) -> None:
        """The answer once the drafts are in (``Answerer.answer``), then the Summary. With a hedge under way,
        its answer where no draft is valid or it won the race (``hedged``); else it is cancelled.
        ``accepted``: a draft that stood as is before the round ended, ranked first."""
        self._finishing = True
        ranked = self.judge.ranked()
        if accepted is not None:  # stable: the rest keep their order
            ranked.sort(key=lambda r: r[0] is not accepted)
        t_ref = time.perf_counter()
        if self.hedge is not None and (hedged or not ranked) and not self.hedge.failed():
            a = await self.hedge.answer(self.stream)
        else:
            if self.hedge is not None:
                await self.hedge.cancel()
            a = await self.answerer.answer(ranked, self.rounds.attempt)
        if self.ctx.policy.learn_every:  # grading every draft only feeds the learner; parses client text: off the loop
            ctx = self.ctx
            self.outcome += await asyncio.to_thread(outcome_rows, ranked, a.text, ctx.task, ctx.spec, ctx.rules)
        refine_ms = (time.perf_counter() - t_ref) * MS_PER_S
        timings = t.Timings(
            verify_ms=verify_ms,
            refine_ttft_ms=a.ttft_ms,
            refine_ms=refine_ms,
            total_ms=self._ms(),
            decode_steps=a.steps,
            decode_tokens=a.generated,
        )
        self.stream.put(self._summary(ranked, a, timings))

    def _at_deadline(self) -> t.Summary | None:
        """The best answer the session has when its deadline expires mid-work (refinement, retries,
        candidates): the best verified draft, as is; None when no draft was verified valid. The
        deadline bounds the wait: an answer before it, never a better one after."""
        ranked = self.judge.ranked()
        if not ranked:
            return None
        a = draft_answer(
            ranked[0][0], t.RefineMode.DEADLINE, "deadline reached: the best verified draft returned as is"
        )
        return self._summary(ranked, a, t.Timings(total_ms=self._ms()))

    # ---- driver ---------------------------------------------------------------------
    async def _consume(self, inbox: AsyncIterator[EdgeItem]) -> None:
        round_tasks: list[asyncio.Task] = []
        if self._hedges():
            self.hedge = Hedge(self.ctx, judge=self.judge, odds=self.round_odds.odds(self.kind))
            self.judge.defer_scoring()  # the hedge's answer is the session's: the drafts are not scored
        try:
            await self._race(inbox, round_tasks, self.hedge)
        finally:  # a cancelled or failed session stops its verifications (and their vLLM requests)
            for tk in round_tasks:
                tk.cancel()
            await asyncio.gather(*round_tasks, return_exceptions=True)
            if self.hedge is not None:
                await self.hedge.cancel()

    async def _race(self, inbox: AsyncIterator[EdgeItem], round_tasks: list[asyncio.Task], hedge: Hedge | None) -> None:
        """The drafts' round against what may answer before it ends: a draft that stands as is
        (``PolicyConfig.accept_first``) answers at once; a hedge that ends first answers at once
        (``Hedge.won``); else the round's end answers as usual (the hedge's answer where no draft is
        valid). Cut short, the drafts still under way are unread (the edge stops drafting when the
        Summary comes) and those read get their verdicts first."""
        rounds = asyncio.create_task(self._rounds(inbox, round_tasks), name="rounds")
        first = asyncio.create_task(self._accepted.wait(), name="accepted")
        try:
            while not rounds.done():
                racing = {rounds, first} | ({hedge.task} if hedge is not None and not hedge.task.done() else set())
                await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
                if rounds.done() or self._finishing:
                    break  # the round answers
                if first.done():  # its verdict already told the judge to score no more
                    await self._cut_round(rounds, round_tasks)
                    self._observe(True)
                    await self._finish(self._ms(), accepted=self._first)
                    return
                if hedge is not None and hedge.task.done() and hedge.won(bool(self.judge.ranked())):
                    self._skip_scoring()
                    await self._cut_round(rounds, round_tasks)
                    await self._finish(self._ms(), hedged=True)
                    return
            await rounds  # it ended first, or a hedge that failed its checks waits for a valid draft's round
        finally:
            for tk in (rounds, first):
                tk.cancel()  # a no-op on a task done
            await asyncio.gather(rounds, first, return_exceptions=True)

    @staticmethod
    async def _cut_round(rounds: asyncio.Task, round_tasks: list[asyncio.Task]) -> None:
        """Stop reading the round, and wait for the verdicts of the drafts read (the judge was told to score
        no more): every draft read has its verdict before the Summary."""
        rounds.cancel()  # no draft is read past here
        await asyncio.gather(rounds, return_exceptions=True)
        await asyncio.gather(*round_tasks, return_exceptions=True)

    async def _verify_and_emit(self, d: t.Draft) -> None:
        v = await self.judge.verdict(d)
        self.stream.put(v)
        j = self.judge.judged[d.index]
        if (
            self.ctx.policy.accept_first
            and self._first is None
            and not self._finishing
            and self.answerer.stands_alone(j)
        ):
            self.judge.skip_scoring(ACCEPTED_FIRST)  # at once, before the next draft's scoring turn
            self._first = j
            self._accepted.set()

    async def _rounds(self, inbox: AsyncIterator[EdgeItem], round_tasks: list[asyncio.Task]) -> None:
        rounds, p = self.rounds, self.ctx.policy
        async for item in inbox:
            if isinstance(item, t.Draft):
                rounds.take(item)  # within the limits before it is tokenized
                item = self.ctx.engine.in_target_tokens(item)  # counted in the target's tokens from here on
                round_tasks.append(asyncio.create_task(self._verify_and_emit(item), name=f"d{item.index}"))
                continue
            rounds.close(item.count)
            self._skip_scoring()
            # shielded: a round cut short meanwhile (``_race``) still gives these drafts their verdicts
            await _shielded(round_tasks)
            verify_ms = self._ms()
            round_tasks.clear()
            found = bool(self.judge.ranked())
            self._observe(found)
            if (
                found
                or self.hedge is not None  # the cloud's own answer is under way: no retry waits for drafts
                or rounds.attempt >= p.max_retries
                or rounds.drafts_left < 1
                or not self._another_round_pays()
            ):
                await self._finish(verify_ms)
                return
            rounds.attempt += 1
            self.stream.put(
                retry_advice(
                    verdicts=[j.verdict for j in self.judge.judged.values()],
                    attempt=rounds.attempt,
                    drafts_left=rounds.drafts_left,
                    recommended=self.recommended_drafts,
                )
            )
        # the edge closed its side without finishing a round: answer from what we have
        self._skip_scoring()
        await _shielded(round_tasks)
        await self._finish(self._ms())

    async def _drive(self, inbox: AsyncIterator[EdgeItem]) -> None:
        """The session's work, its end or failure handed to the reader through the stream."""
        try:
            async with asyncio.timeout(self.deadline_s):
                await self._consume(inbox)
            self.stream.end()
        except TimeoutError:
            best = self._at_deadline()
            if best is None:
                self.stream.fail(
                    DeadlineExceeded(
                        f"deadline_ms: session exceeded its {self.deadline_s * MS_PER_S:.0f} ms deadline with no verified draft"
                    )
                )
                return
            # what was streamed of an unfinished refinement is not the answer
            self.stream.replace(best.answer, "deadline: the best verified draft, as is")
            self.stream.put(best)
            self.stream.end()
        except BaseException as exc:  # hand every failure to the reader
            self.stream.fail(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def run(self, inbox: AsyncIterator[EdgeItem]) -> AsyncIterator[t.CloudEvent]:
        ctx = self.ctx
        yield t.SessionAccepted(ctx.req.request_id, ctx.rules.labels, self.recommended_drafts)
        task = asyncio.create_task(self._drive(inbox))
        try:
            async for ev in self.stream.events():
                yield ev
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


def _shielded(tasks: list[asyncio.Task]) -> asyncio.Future:
    """The tasks gathered, shielded from the awaiting task's cancellation. A session cancelled meanwhile
    (its deadline, the client gone) never reads the gather, whose tasks its cleanup cancels: the outcome
    is read here, so that asyncio does not log an exception nobody retrieved."""
    gathered = asyncio.gather(*tasks)
    gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
    return asyncio.shield(gathered)
