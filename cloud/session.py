"""One co-inference session: verify drafts as they arrive, then answer (docs/design.md §2.2).

``Session`` coordinates its parts, each in a file of its own: the judge turns drafts into verdicts
(``coinfer.cloud.judging.Judge``), the answerer turns them into an answer (``coinfer.cloud.answering.Answerer``),
the answer stream owns what the client was shown (``coinfer.cloud.answer_stream.AnswerStream``).

The session is one loop over typed events (``_Event``), the way vLLM's engine core runs one step loop: the
edge's messages (read by one task), each draft's verdict, the hedge's end, the answer's end. Each handler
decides the next step from the session's state; nothing races. The deadline bounds the loop.

Two ways to answer an open request (``PolicyConfig.verifier``):
- exact (the default): the answer is the target's own; it takes the drafts' tokens where they are the ones
  it would write (``coinfer.cloud.speculation``), and may ask the edge for drafts that continue its text
  (``DraftFrom``). It begins at the first greedy draft of the first round (or at the round's end);
- likelihood / judge (they may change the answer): a draft the verifier passes may be the answer as is.
A request whose rules decide (a preset's checkers) takes a draft the rules pass, whatever the verifier.

Input: the edge's drafts and end-of-round markers (an async iterator).
Output: domain events (``coinfer.types``) in the order the edge should see them: ``SessionAccepted``, a
``Verdict`` per draft as soon as it is judged, then either ``AnswerChunk``s (and ``DraftFrom``s) and a
``Summary``, or ``RetryAdvice`` and another round.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from coinfer import types as t
from coinfer.cloud.answer import Answer, draft_answer
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.answering import Answerer
from coinfer.cloud.config import CloudConfig
from coinfer.cloud.context import SessionContext
from coinfer.cloud.engine import TargetEngine
from coinfer.cloud.exact_drafts import ExactDrafts
from coinfer.cloud.hedge import Hedge
from coinfer.cloud.judging import Judge
from coinfer.cloud.learning import Outcome, outcome_rows
from coinfer.cloud.policy import RoundOdds, retry
from coinfer.cloud.ranking import MS_PER_S, Judged, Ranked
from coinfer.cloud.rounds import Rounds, request_kind, retry_advice
from coinfer.cloud.summary import summary
from coinfer.errors import DeadlineExceeded
from coinfer.rules import RuleSet
from coinfer.serving.offload import run_sized
from coinfer.tasks import Task

log = logging.getLogger(__name__)


@dataclass
class DraftsDone:
    """End of a round of drafts (``count`` drafts were sent in it; ``continues``: the ``DraftFrom`` round it
    ends, 0 for one of the session's own rounds)."""

    count: int
    continues: int = 0


EdgeItem = t.Draft | DraftsDone


# ---- the loop's events ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _EdgeSent:
    """The edge sent a draft or ended a round."""

    item: EdgeItem


@dataclass(frozen=True)
class _EdgeClosed:
    """The edge closed its side."""


@dataclass(frozen=True)
class _Judged:
    """A draft's verdict is in (``Judge.judged``)."""

    index: int


@dataclass(frozen=True)
class _HedgeEnded:
    """The cloud's own answer begun at open has ended (``coinfer.cloud.hedge``)."""


@dataclass(frozen=True)
class _Answered:
    """The answer is written."""

    answer: Answer
    verify_ms: float
    ranked: Ranked


@dataclass(frozen=True)
class _Failed:
    """A part of the session failed: the session fails with it."""

    error: BaseException


_Event = _EdgeSent | _EdgeClosed | _Judged | _HedgeEnded | _Answered | _Failed


class _Phase(enum.Enum):
    COLLECTING = "collecting"
    """Drafts are read and judged."""
    CLOSING = "closing"
    """The round ended (or was cut): its verdicts are awaited, then ``_then`` decides."""
    ANSWERING = "answering"
    """The answer is being written; drafts read now are a continuation round's, or dropped."""


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
        hedge); ``drafting``: drafts may come (False: the cloud plan, which answers alone at once)."""
        self.ctx = SessionContext(cfg=cfg, engine=engine, req=req, task=task, spec=spec, rules=rules)
        # rendered now: a conversation the target cannot read (a request in chat form and no chat template, or
        # one its template refuses) is the open's error (INVALID_ARGUMENT naming why), before any draft is taken
        self.ctx.prompt_text  # noqa: B018 - cached for the session's parts
        self.recommended_drafts, self.deadline_s, self.round_odds = recommended_drafts, deadline_s, round_odds
        self.stream = AnswerStream()
        stands = self._stands if cfg.policy.accept_first and not self.ctx.exact else None
        self.judge = Judge(self.ctx, weights=weights, load=load, stands=stands)
        self.answerer = Answerer(self.ctx, judge=self.judge, stream=self.stream)
        self.rounds = Rounds(limits=cfg.limits)
        self.load, self.drafting = load, drafting
        self.hedge: Hedge | None = None
        """The cloud's own answer racing the drafts (``coinfer.cloud.hedge``), begun when the session runs."""
        self.outcome: list[Outcome] = []
        """(score, agreement, latency_s, label) per ranked draft once finished: the learner's input."""
        self.t0 = time.perf_counter()
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self._phase = _Phase.COLLECTING
        self._then: Callable[[], None] | None = None
        """What the session does once the verdicts awaited are in (``_Phase.CLOSING``)."""
        self._held: list[_Event] = []
        """The edge's messages that came while a round closed: read once it is decided."""
        self._judging: set[asyncio.Task] = set()
        self._answering: asyncio.Task | None = None
        self.exact_drafts = ExactDrafts(self.ctx, self.stream)
        """What exact verification proposes: the first round's drafts, the edge's continuations (``DraftFrom``)."""
        self._failed: BaseException | None = None
        """The part's error the session failed on (reported once, by the session)."""

    def _ms(self) -> float:
        return (time.perf_counter() - self.t0) * MS_PER_S

    @property
    def kind(self) -> tuple:
        """What rounds of drafts of this request are counted by (``RoundOdds``)."""
        return request_kind(self.ctx.req, self.ctx.rules)

    # ---- the loop -----------------------------------------------------------------------------------------
    async def run(self, inbox: AsyncIterator[EdgeItem]) -> AsyncIterator[t.CloudEvent]:
        ctx = self.ctx
        yield t.SessionAccepted(ctx.req.request_id, ctx.rules.labels, self.recommended_drafts)
        task = asyncio.create_task(self._drive(inbox))
        try:
            while (ev := await self.stream.next()) is not None:
                yield ev
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _drive(self, inbox: AsyncIterator[EdgeItem]) -> None:
        """The session's work, its end or failure handed to the reader through the stream."""
        try:
            async with asyncio.timeout(self.deadline_s):
                await self._loop(inbox)
            self.stream.end()
        except TimeoutError:
            self._at_deadline()
        except BaseException as exc:  # hand every failure to the reader
            self.stream.fail(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _loop(self, inbox: AsyncIterator[EdgeItem]) -> None:
        reader = asyncio.create_task(self._read(inbox), name="edge-inbox")
        try:
            self._open()
            answered: _Answered | None = None
            while answered is None or self._judging:  # every draft read has its verdict before the Summary
                ev = await self._events.get()
                if isinstance(ev, _Failed):
                    self._failed = ev.error
                    raise ev.error
                if isinstance(ev, _Answered):
                    answered = ev
                    continue
                self._on(ev)
                self._step()
            await self._summarize(answered)
        finally:  # a cancelled or failed session stops its parts (and their engine requests)
            parts = [reader, *self._judging, *([self._answering] if self._answering else [])]
            for tk in parts:
                tk.cancel()
            results = await asyncio.gather(*parts, return_exceptions=True)
            for r in results:  # a part's failure the session did not end on: said, not swallowed
                if isinstance(r, Exception) and r is not self._failed:
                    log.warning("a session part failed after the session's end: %r", r)
            if self.hedge is not None:
                await self.hedge.cancel()

    async def _read(self, inbox: AsyncIterator[EdgeItem]) -> None:
        """The edge's messages into the loop (one task: a cancelled read never leaves the stream half-read)."""
        try:
            async for item in inbox:
                self._events.put_nowait(_EdgeSent(item))
            self._events.put_nowait(_EdgeClosed())
        except Exception as exc:  # noqa: BLE001 - the session fails with the edge's stream
            self._events.put_nowait(_Failed(exc))

    def _spawn(self, coro, name: str, on_done: Callable[[asyncio.Task], _Event | None]) -> asyncio.Task:
        """A part's task, whose end becomes the loop's event (``on_done``), or ``_Failed`` with its error."""

        def done(tk: asyncio.Task) -> None:
            if tk.cancelled():
                return
            if (exc := tk.exception()) is not None:
                self._events.put_nowait(_Failed(exc))
            elif (ev := on_done(tk)) is not None:
                self._events.put_nowait(ev)

        tk = asyncio.create_task(coro, name=name)
        tk.add_done_callback(done)
        return tk

    def _open(self) -> None:
        """At open: the cloud plan answers at once, and so does exact verification on an engine that takes drafts
        inside its generation (they reach it as they come: the target never waits for the edge); a kind whose
        drafts rarely pass gets a hedge."""
        if not self.drafting or (self.ctx.exact and self.ctx.engine.takes_drafts):
            self._answer(self._ms())
        elif self._hedges():
            self.hedge = Hedge(self.ctx, judge=self.judge, odds=self.round_odds.odds(self.kind))
            self.hedge.task.add_done_callback(lambda _: self._events.put_nowait(_HedgeEnded()))
            self.judge.defer_scoring()  # the hedge's answer is the session's: the drafts are not scored

    def _step(self) -> None:
        """Once a closing round's verdicts are in, what it decided; then the edge's messages held meanwhile,
        where the session reads on (a retry round)."""
        while self._phase is _Phase.CLOSING and not self._judging and self._then is not None:
            then, self._then = self._then, None
            then()
            if self._phase is _Phase.COLLECTING:
                held, self._held = self._held, []
                for ev in held:
                    self._on(ev)
        if self._phase is _Phase.ANSWERING:
            self._held = []  # drafts of a round cut short: unread

    def _on(self, ev: _Event) -> None:
        if isinstance(ev, (_EdgeSent, _EdgeClosed)) and self._phase is _Phase.CLOSING:
            self._held.append(ev)  # read after the round's decision, as the edge sent them
            return
        if isinstance(ev, _EdgeSent):
            if isinstance(ev.item, t.Draft):
                self._on_draft(ev.item)
            else:
                self._on_round_end(ev.item)
        elif isinstance(ev, _EdgeClosed):
            self._on_edge_closed()
        elif isinstance(ev, _Judged):
            self._on_verdict(self.judge.judged[ev.index])
        elif isinstance(ev, _HedgeEnded):
            self._on_hedge_ended()

    # ---- handlers -----------------------------------------------------------------------------------------
    def _on_draft(self, d: t.Draft) -> None:
        if d.continues:
            self.exact_drafts.take(d)
            return
        self.rounds.take(d)  # every draft read is within the limits (an index sent twice is refused)
        answering_exactly = self.ctx.exact and self._phase is _Phase.ANSWERING
        if self._phase is not _Phase.COLLECTING and not answering_exactly:
            return  # the round was cut short (the session answers): drafts read after it are not judged
        # (an exact answer began at the round's greedy draft: its other drafts still get their verdicts, the
        # rules' alone, which cost no engine time)
        d = self.ctx.engine.in_target_tokens(d)  # counted in the target's tokens from here on
        if self.rounds.attempt == 0:
            self.exact_drafts.arrived(d)
        self._judging.add(self._spawn(self.judge.verdict(d), f"d{d.index}", lambda tk, i=d.index: self._judged(tk, i)))
        if self.ctx.exact and d.greedy and self.rounds.attempt == 0 and self._phase is _Phase.COLLECTING:
            self._answer(self._ms())  # the greedy draft is the one the target takes most of: begin at once

    def _judged(self, tk: asyncio.Task, index: int) -> _Event:
        self._judging.discard(tk)
        return _Judged(index)

    def _stands(self, j: Judged) -> bool:
        """A draft that stands as is answers the session at once (``PolicyConfig.accept_first``), while its
        round is read: the judge stops scoring the drafts after it."""
        return self._phase is _Phase.COLLECTING and self.answerer.stands_alone(j)

    def _on_verdict(self, j: Judged) -> None:
        self.stream.put(j.verdict)
        first = self.judge.first
        if first is not None and first.draft.index == j.draft.index and self._phase is _Phase.COLLECTING:
            self._close(lambda: (self._observe(True), self._answer(self._ms(), accepted=j)))

    def _on_round_end(self, done: DraftsDone) -> None:
        if done.continues:
            self.exact_drafts.round_ended(done.continues)
            return
        if self.rounds.attempt == 0:
            self.exact_drafts.first_round_over()
        if self._phase is not _Phase.COLLECTING:
            return
        self.rounds.close(done.count)
        if self.hedge is not None:
            self._stop_scoring(self._hedge_reason())
        self._close(self._round_over)

    def _on_edge_closed(self) -> None:
        self.exact_drafts.edge_closed()
        if self._phase is not _Phase.COLLECTING:
            return
        # the edge closed its side without finishing a round: answer from what we have
        if self.hedge is not None:
            self._stop_scoring(self._hedge_reason())
        self._close(lambda: self._answer(self._ms()))

    def _on_hedge_ended(self) -> None:
        if self._phase is _Phase.COLLECTING and self.hedge.won(bool(self.judge.ranked())):
            self._stop_scoring(self._hedge_reason())
            self._close(lambda: self._answer(self._ms(), hedged=True))

    def _round_over(self) -> None:
        """A round's verdicts are in: answer, or advise another round."""
        found = bool(self.judge.ranked())
        self._observe(found)
        p, rounds = self.ctx.policy, self.rounds
        if (
            found
            or self.ctx.exact  # the target answers itself from what it takes of the drafts
            or self.hedge is not None  # the cloud's own answer is under way: no retry waits for drafts
            or rounds.attempt >= p.max_retries
            or rounds.drafts_left < 1
            or not self._another_round_pays()
        ):
            self._answer(self._ms())
            return
        rounds.next_round()
        self._phase = _Phase.COLLECTING
        self.stream.put(
            retry_advice(
                verdicts=[j.verdict for j in self.judge.judged.values()],
                attempt=rounds.attempt,
                drafts_left=rounds.drafts_left,
                recommended=self.recommended_drafts,
            )
        )

    # ---- steps --------------------------------------------------------------------------------------------
    def _close(self, then: Callable[[], None]) -> None:
        """Stop taking drafts; once the verdicts of those taken are in, ``then``."""
        self._phase, self._then = _Phase.CLOSING, then

    def _stop_scoring(self, why: str) -> None:
        """Drafts waiting for the LLM verifier get their verdict now, unscored, saying ``why``."""
        self.judge.skip_scoring(why)

    def _hedge_reason(self) -> str:
        return f"the cloud answered itself: rounds of this kind held a valid draft {self.hedge.odds:.0%} of the time lately"

    def _answer(self, verify_ms: float, *, hedged: bool = False, accepted: Judged | None = None) -> None:
        """Begin the answer (once): from the drafts, the hedge, or the target taking the drafts' tokens."""
        if self._answering is not None:
            return
        self._phase, self._then = _Phase.ANSWERING, None
        ranked = self.judge.ranked()
        if accepted is not None:  # stable: the rest keep their order
            ranked.sort(key=lambda r: r[0] is not accepted)
        self._answering = self._spawn(
            self._write(ranked, hedged), "answer", lambda tk: _Answered(tk.result(), verify_ms, ranked)
        )

    async def _write(self, ranked: Ranked, hedged: bool) -> Answer:
        if self.ctx.exact:
            x = self.exact_drafts
            return await self.answerer.exact(await x.first_proposals(), x.more, x.later())
        if self.hedge is not None and (hedged or not ranked) and not self.hedge.failed():
            try:
                return await self.hedge.answer(self.stream)
            except Exception:  # noqa: BLE001 - the session answers without it
                log.warning("the hedge failed while it answered; the session answers without it", exc_info=True)
                if self.stream.final:  # what it streamed as final stays the answer's beginning
                    return self._as_streamed("the cloud's own answer failed after streaming")
                self.stream.withdraw("the cloud's own answer failed")
        if self.hedge is not None:
            await self.hedge.cancel()
        return await self.answerer.answer(ranked, self.rounds.attempt)

    def _as_streamed(self, why: str) -> Answer:
        """The answer as far as it was streamed as final (finish "length": it did not end there)."""
        final = self.stream.final
        self.stream.replace(final, why)
        return Answer(
            text=final,
            source=t.AnswerSource.CLOUD,
            valid=False,
            parsed=None,
            mode=t.RefineMode.ALONE,
            finish=t.FinishReason.LENGTH,
            note=f"{why}: the answer as far as it was streamed as final",
        )

    async def _summarize(self, ev: _Answered) -> None:
        a, ranked = ev.answer, ev.ranked
        timings = t.Timings(
            verify_ms=ev.verify_ms,
            refine_ttft_ms=a.ttft_ms,
            refine_ms=self._ms() - ev.verify_ms,
            total_ms=self._ms(),
            decode_steps=a.steps,
            decode_tokens=a.generated,
        )
        if (
            self.ctx.policy.learn_every and ranked
        ):  # grading every draft only feeds the learner: the drafts are parsed already, the answer is not
            ctx = self.ctx
            size = ctx.rules.check_size(a.text)
            self.outcome += await run_sized(size, outcome_rows, ranked, a.text, ctx.task, ctx.spec, ctx.rules)
        self.stream.put(self._summary(ranked, a, timings))

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

    def _at_deadline(self) -> None:
        """The deadline expired mid-work: the best answer the session has that keeps what the client was shown
        as final -- the best verified draft where it begins with that text (not under exact verification, where
        a draft is no answer of the target's), else the text shown as final, cut (finish "length") -- and an
        error where it has none. The deadline bounds the wait: an answer before it, never a better one after;
        and nothing streamed as final is withdrawn."""
        final, ranked = self.stream.final, self.judge.ranked()
        # under exact verification a draft is no answer of the target's: only what it wrote is
        drafts = [] if self.ctx.exact else ranked
        best = next((j for j, _, _ in drafts if j.draft.text.startswith(final)), None)
        if best is not None:
            a = draft_answer(best, t.RefineMode.DEADLINE, "deadline reached: the best verified draft returned as is")
            self.stream.replace(a.text, "deadline: the best verified draft, as is")
        elif final:
            a = self._as_streamed("deadline reached")
            a.mode = t.RefineMode.DEADLINE
        else:
            ms = self.deadline_s * MS_PER_S
            self.stream.fail(
                DeadlineExceeded(f"deadline_ms: session exceeded its {ms:.0f} ms deadline with no verified draft")
            )
            return
        self.stream.put(self._summary(ranked, a, t.Timings(total_ms=self._ms())))
        self.stream.end()

    # ---- round odds -------------------------------------------------------------------------------------
    def _observe(self, found: bool) -> None:
        """Count the round that ended: a first round under the request's kind, a retry round apart (``retry``)."""
        if self.round_odds is not None and (self.hedge is None or self.ctx.rules_decide):
            # a round whose drafts were not scored (a hedge answered) tells nothing
            self.round_odds.observe(self.kind if self.rounds.attempt == 0 else retry(self.kind), found)

    def _hedges(self) -> bool:
        """Whether to begin the cloud's own answer at open (``PolicyConfig.hedge_below_odds``): drafts may
        come, rounds of this kind rarely hold a valid one, and the engine is not heavily loaded. Never under
        exact verification: the target's own answer is what it writes anyway, drafts or not."""
        p = self.ctx.policy
        return (
            not self.ctx.exact
            and self.round_odds is not None
            and self.load < p.hedge_max_load
            and self.round_odds.rare(self.kind, p.hedge_below_odds)
        )

    def _another_round_pays(self) -> bool:
        """Whether another round of drafts is worth its wait: rounds of this kind of request lately held a
        valid draft often enough (``PolicyConfig.min_round_odds``), and not so rarely that the cloud would
        not wait for the first (``hedge_below_odds``: a round it does wait for then only explores)."""
        odds, p = self.round_odds, self.ctx.policy
        if odds is None:
            return True
        return not odds.rare(self.kind, p.hedge_below_odds) and odds.pays(self.kind, p.min_round_odds)
