"""The drafts a session's exact verification proposes (``coinfer.cloud.speculation``): the first round's, and the
edge's continuation rounds (``DraftFrom``), each with its calculator repair.

A continuation is first taken from the drafts the session holds (the first round's, as repaired, and the edge's
continuations so far) that continue the answer written so far, which costs no round trip; the edge is asked for
one only where none does, while the rounds' takes make another worth its wait (``speculation.Continuation``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

from coinfer import types as t
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.context import SessionContext
from coinfer.cloud.ranking import MS_PER_S
from coinfer.cloud.speculation import Continuation, Proposal, proposed
from coinfer.errors import InvalidArgument

log = logging.getLogger(__name__)


class ExactDrafts:
    """One session's drafts for exact verification, and its continuation rounds asked of the edge (on ``stream``)."""

    def __init__(self, ctx: SessionContext, stream: AnswerStream) -> None:
        self.ctx, self.stream = ctx, stream
        self.first: list[t.Draft] = []
        """The first round's drafts, as they came."""
        self._continued: list[t.Draft] = []
        """The drafts of the edge's continuation rounds, each of the whole answer."""
        self._repairs: dict[str, str | None] = {}
        """Each proposed draft's calculator repair (None: none), computed once: every continuation proposes the
        drafts in hand again."""
        self._more: asyncio.Future[list[t.Draft]] | None = None
        """A continuation round asked of the edge, resolved with its drafts at its end."""
        self._more_drafts: list[t.Draft] = []
        self._arrivals: asyncio.Queue[t.Draft | None] | None = None
        """First-round drafts that came after ``later`` began (None: the round is over)."""
        self._round_over = False
        p = ctx.policy
        self._asking = Continuation(
            rounds=p.draft_from_rounds, min_accepted=p.draft_from_min_accepted, misses=p.draft_from_misses
        )

    def arrived(self, d: t.Draft) -> None:
        """A draft of the first round (in the target's tokens)."""
        self.first.append(d)
        if self._arrivals is not None:
            self._arrivals.put_nowait(d)

    def first_round_over(self) -> None:
        """No more drafts of the first round come (its end, or the edge closed)."""
        self._round_over = True
        if self._arrivals is not None:
            self._arrivals.put_nowait(None)

    async def later(self) -> AsyncIterator[Proposal]:
        """The first round's drafts that come from now on, each as proposed (its repair first), until the round
        is over: what an engine that takes drafts inside the generation is sent while it writes."""
        if self._arrivals is None:
            return
        while (d := await self._arrivals.get()) is not None:
            for p in await self._proposed([d]):
                yield p

    async def first_proposals(self) -> list[Proposal]:
        """The first round's drafts as proposed, the greedy one first (the one the target takes most of); on an
        engine that takes drafts inside the generation, those that come after this call are ``later``'s."""
        if self.ctx.engine.takes_drafts and not self._round_over:
            self._arrivals = asyncio.Queue()
        return await self._proposed(sorted(self.first, key=lambda d: not d.greedy))

    async def more(self, text: str, accepted: int) -> list[Proposal]:
        """Drafts of the whole answer that continue ``text`` (the answer so far): those the session holds already,
        which cost no round trip; else the edge's (``_ask``). The greedy draft ends early
        (``edge.remote.GREEDY_DRAFT_TOKENS``) and the round's others come while it is checked: on held-out word
        problems the answer so far was most often the beginning of another draft's repair (docs/measurements.md,
        "Exact split on word problems")."""
        held = [
            p
            for p in await self._proposed([*self.first, *self._continued])
            if p.text.startswith(text) and (len(p.text) > len(text) or p.ended)
        ]
        if held:
            return held
        asks = self.ctx.req.drafts_on_request and self.ctx.policy.draft_from_rounds > 0
        return await self._ask(text, accepted) if asks else []

    async def _ask(self, text: str, accepted: int) -> list[Proposal]:
        """Drafts that continue ``text``, asked of the edge while the rounds' takes make another worth its wait;
        none where the edge's round does not end within ``draft_from_wait_ms`` (the target then decodes the rest)."""
        p = self.ctx.policy
        if not self._asking.ask(accepted):
            return []
        self._more, self._more_drafts = asyncio.get_running_loop().create_future(), []
        log.debug("%s: continuation round %d asked after %d chars", self.ctx.key, self._asking.asked, len(text))
        self.stream.put(
            t.DraftFrom(text=text, max_new_tokens=p.draft_from_tokens, num_drafts=1, round=self._asking.asked)
        )
        try:
            async with asyncio.timeout(p.draft_from_wait_ms / MS_PER_S):
                drafts = await self._more
        except TimeoutError:
            log.debug("no continuation drafts within %d ms: the target decodes the rest", p.draft_from_wait_ms)
            return []
        finally:
            self._more = None
        self._continued.extend(drafts)
        return await self._proposed(drafts)

    async def _proposed(self, drafts: Sequence[t.Draft]) -> list[Proposal]:
        """``drafts`` (of the whole answer) as exact verification is offered them (``speculation.proposed``): with
        their calculator repairs where the session repairs drafts (client rules: off the loop)."""
        pairs = [(d.text, not d.truncated) for d in drafts]
        if not self.ctx.repairs:
            return proposed(pairs, None)
        todo = list({text for text, _ in pairs if text not in self._repairs})
        if todo:
            repaired = await asyncio.to_thread(lambda: [self.ctx.rules.repaired(text) for text in todo])
            self._repairs.update(zip(todo, repaired))
        return proposed(pairs, self._repairs.get)

    def take(self, d: t.Draft) -> None:
        """A draft of a continuation round: kept for the round asked now, dropped where it answers an earlier
        one (it came after the answer stopped waiting for it)."""
        if self._more is None or d.continues != self._asking.asked:
            return
        lim = self.ctx.cfg.limits
        if len(d.text) > lim.max_draft_chars:
            raise InvalidArgument(f"draft.text: {len(d.text)} chars > limit {lim.max_draft_chars}")
        if len(self._more_drafts) >= max(1, lim.max_drafts):
            raise InvalidArgument(f"draft: more than {lim.max_drafts} drafts in one continuation round")
        self._more_drafts.append(d)

    def round_ended(self, continues: int) -> None:
        """The edge ended continuation round ``continues``: the round asked now is answered with its drafts."""
        if continues == self._asking.asked:
            self.edge_closed()

    def edge_closed(self) -> None:
        """No more drafts come for the round asked now (if any): it is answered with what came."""
        self.first_round_over()
        if self._more is not None and not self._more.done():
            self._more.set_result(self._more_drafts)
