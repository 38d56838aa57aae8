"""The cloud's own answer begun at session open, racing the drafts (``PolicyConfig.hedge_below_odds``).

Where rounds of drafts of a kind of request lately held a valid draft too rarely to wait for (a draft model
the target seldom agrees with: SmolLM2 drafting for Gemma 3 270M, 6% of drafts accepted; the demo pair's
held-out select problems, none), the user would wait a drafting round and its verification before the
cloud began the answer it ends on anyway. The hedge begins that answer at once, written into a stream of
its own that nobody reads, and the session answers with it, except where the rules alone decide
(``SessionContext.rules_decide``: a preset's exact checkers, no model asked) and a draft they pass comes
first: then the hedge is cancelled (its engine request aborted) and the drafts answer. Drafts that need
the LLM verifier are not scored (``Judge.defer_scoring``): their prefill would slow the hedge on the same
engine, for drafts the odds say will not be valid; their verdict says ``not_scored``. A hedge that ends
first answers at once, the drafts still under way unread (``Hedge.won``); where the round ends first, the
hedge answers as it writes: what it wrote is relayed to the session's stream in order, final where it was
written as final, and the rest streams as it comes.

Its cost is the cloud's own answer, which the session pays anyway when no draft is valid, less the drafts'
scoring; it is wasted only where a draft wins. A hedged session's round is not counted, so a hopeless kind's
odds fade until its rounds are waited for and counted again (``RoundOdds.rare``): the odds keep being
measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from coinfer import types as t
from coinfer.cloud.alone import CloudAlone
from coinfer.cloud.answer import Answer
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.context import SessionContext
from coinfer.cloud.judging import Judge
from coinfer.cloud.writer import Writer

log = logging.getLogger(__name__)

HEDGE_KEY_SUFFIX = "h"
"""Appended to the session's engine key: the hedge's requests never share an id with the answerer's."""


class Hedge:
    """The cloud's own answer for one session, under way from construction (``answer``, ``cancel``)."""

    def __init__(self, ctx: SessionContext, *, judge: Judge, odds: float) -> None:
        hctx = dataclasses.replace(ctx, key=ctx.key + HEDGE_KEY_SUFFIX)
        self.odds = odds
        self._held = AnswerStream()
        why = (
            f"the cloud answered from session open, racing the drafts (rounds of this kind held a valid draft "
            f"{odds:.0%} of the time lately)"
        )
        alone = CloudAlone(hctx, judge=judge, writer=Writer(hctx, self._held), stream=self._held, no_drafts=why)
        self.task: asyncio.Task[Answer] = asyncio.create_task(alone.answer(), name="hedge")

    def _ended(self) -> Answer | BaseException | None:
        """Its answer, or the error it ended on; None while it runs (or once cancelled)."""
        if not self.task.done() or self.task.cancelled():
            return None
        return self.task.exception() or self.task.result()

    def won(self, valid_draft: bool) -> bool:
        """Its answer is written: the session may answer with it now. Where it failed its checks (a loop cut,
        a rule no try passed) and a draft judged so far is valid (``valid_draft``), the round that holds
        that draft answers instead; where none is, the odds say the round's rest will hold none either
        (that is why the hedge began), and the answer the cloud would end on anyway is not held back for it."""
        a = self._ended()
        return isinstance(a, Answer) and (a.valid or not valid_draft)

    def failed(self) -> bool:
        """It ended on an error before its answer was asked for (logged here): the session answers without
        it, as it would have with no hedge, and loses nothing (none of its text was relayed)."""
        err = self._ended()
        if not isinstance(err, BaseException):
            return False
        log.warning("the hedge failed; the session answers without it", exc_info=err)
        return True

    async def answer(self, out: AnswerStream) -> Answer:
        """Relay what the hedge wrote into ``out`` (and the rest as it is written), then its answer."""
        relay = asyncio.create_task(self._relay(out), name="hedge-relay")
        try:
            a = await self.task
        finally:
            self._held.end()
            await relay
        return a

    async def _relay(self, out: AnswerStream) -> None:
        async for ev in self._held.events():
            if isinstance(ev, t.AnswerChunk):
                out.chunk(ev.text, ev.final)
            elif isinstance(ev, t.AnswerReset):
                out.withdraw(ev.reason)

    async def cancel(self) -> None:
        """Stop the hedge (a draft won, or the session ended): its engine requests are aborted."""
        if not self.task.done():
            self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
