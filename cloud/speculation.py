"""Exact speculation: the target takes a draft's tokens where they are the tokens it would write itself.

A greedy generation writes, at every position, the target's argmax token. A draft's text, tokenized by the
target (the draft model's tokenizer need not be the target's: HF's universal assisted generation compares on
the target's tokens too), is checked in one prefill: the target's argmax at every position of prompt + draft
(``TargetEngine.top_tokens``). The accepted part is the longest prefix of the draft equal to those argmaxes;
the argmax at the first position that differs -- or after the whole draft -- is the target's own next token,
free with the check. The target then decodes the rest from exactly those tokens (the check's blocks sit in
the prefix cache), or, where the caller asks the edge for another draft (``More``), checks that one the same
way. What comes out is what plain greedy decoding writes, token for token, except where prefill and decode
arithmetic break a near-tie differently (docs/api.md, "Exact split").

Of several drafts, the first given is checked first; another is checked only where it can be accepted further:
it shares the accepted tokens and continues with the target's next one (a draft that differs earlier is
rejected earlier, by the same argmaxes). So the longest accepted prefix is found with one check per draft that
can win, at most ``MAX_CHECKS`` per round.

Only a greedy, unpenalised generation is checked this way (its tokens are the argmax of the raw logits that
prompt logprobs report); any other generation is the engine's own, unchanged.

The tokens taken stream one per chunk (``Chunk.accepted``), so that a caller's checks (a loop every 16 tokens,
a step as it ends) see the same text at the same token counts as when the target decodes them itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from coinfer.cloud import sampled
from coinfer.cloud.engine import Chunk, GenParams, TargetEngine, current_cost
from coinfer.cloud.vllm_common import vllm_temperature
from coinfer.types import speculation_kind

log = logging.getLogger(__name__)

MAX_CHECKS = 3
"""Exact checks per round: the first draft, and up to two that extend its accepted tokens. Each costs a prefill
of the prompt past the prefix cache plus the draft."""


@dataclass(frozen=True)
class Proposal:
    """A draft as the target may take it: its text after the point the generation starts, and whether the
    draft ended there by itself (its end of turn is then proposed too: a finished answer costs no decode)."""

    text: str
    ended: bool


def proposed(drafts: Sequence[tuple[str, bool]], repair: Callable[[str], str | None] | None) -> list[Proposal]:
    """Drafts (their text, whether it ended) as the target is offered them: each draft's calculator repair first
    (``repair``'s text, where it changes the draft), then the draft as written; the same text once. A guess is
    all a proposal is -- the answer is the target's own whatever is offered -- and the target computes: where a
    draft's only mistake is a computed value (most of a word problem's drafts), its repair is the text the
    target writes, taken in one check, where the draft as written is refused at the wrong value and costs a
    round per mistake."""
    out: dict[str, Proposal] = {}
    for text, ended in drafts:
        if repair is not None and (fixed := repair(text)) is not None:
            out.setdefault(fixed, Proposal(fixed, ended))
        out.setdefault(text, Proposal(text, ended))
    return list(out.values())


More = Callable[[str, int], Awaitable[Sequence[Proposal]]]
"""The next round of drafts for a generation that has written ``text`` (from where it started), the last
round having taken ``accepted`` draft tokens: the drafts continue ``text`` (their ``Proposal.text`` is what
follows it). An empty answer: none comes, the target decodes the rest."""


@dataclass(kw_only=True)
class Continuation:
    """When an answer asks the edge for another round of drafts (``More``): after each round, given how many
    draft tokens it took. A round that took fewer than ``min_accepted`` is a miss; ``misses`` misses in a row
    end the asking (a pair that disagrees would pay a network round trip per token or two), and so do
    ``rounds`` rounds asked in all. After a refused token the target's own next one realigns the draft, so one
    miss is often followed by a round that takes much (docs/measurements.md, "Exact split")."""

    rounds: int
    min_accepted: int
    misses: int
    asked: int = 0
    """Rounds asked so far: the number of the one asked last (``DraftFrom.round``)."""
    missed: int = 0
    """Misses in a row, up to the last round."""
    ended: bool = False

    def ask(self, accepted: int) -> bool:
        """Whether to ask for another round after one that took ``accepted`` draft tokens (counted as asked);
        once no, always no."""
        self.missed = 0 if accepted >= self.min_accepted else self.missed + 1
        self.ended = self.ended or self.missed >= self.misses or self.asked >= self.rounds
        if self.ended:
            return False
        self.asked += 1
        return True


def _kind(engine: TargetEngine, params: GenParams) -> str:
    """``coinfer.types.speculation_kind`` of ``params`` on an engine that checks tokens ("" on one that does not)."""
    if not engine.speculative:
        return ""
    return speculation_kind(
        temperature=params.temperature,
        top_p=params.top_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
    )


def exact(engine: TargetEngine, params: GenParams) -> bool:
    """Whether a generation with ``params`` can take draft tokens exactly: greedy, unpenalised, on an engine
    that checks tokens."""
    return _kind(engine, params) == "greedy"


def exact_sampled(engine: TargetEngine, params: GenParams) -> bool:
    """Whether a sampled generation can take draft tokens and keep its distribution (``coinfer.cloud.sampled``):
    the whole vocabulary sampled (``top_p`` 1: a nucleus is not known from the top k), unpenalised."""
    return _kind(engine, params) == "sampled"


def _seed_at(seed: int | None, position: int) -> int | None:
    """A seeded request's seed for a sample drawn at ``position``: each engine request seeds its own generator,
    so two requests given the request's seed would draw the same uniforms at different positions."""
    return None if seed is None else (seed + 7919 * position) % 2**31


SAMPLED_TOP_K = 20
"""Logprobs per position a sampled check asks for (vLLM's default ``max_logprobs``): what bounds ``p(x)`` away
from temperature 1."""

MAX_CHAR_TOKENS = 8
"""Tokens sampled after a sampled check's last, at most, to end on a whole character (``check_sampled``)."""


async def check_sampled(
    engine: TargetEngine,
    ids: list[int],
    draft: list[int],
    params: GenParams,
    coin: Callable[[], float],
    request_id: str,
) -> Round:
    """A sampled generation's check of one draft (``coinfer.cloud.sampled.take``): the tokens taken, then the
    target's own token where one was refused (sampled with it excluded), then tokens sampled until the run ends
    on a whole character (a run cut inside one would drop tokens already sampled, which skews what follows)."""
    if not draft:
        return Round(tokens=[], offered=0, accepted=0)
    rows = await engine.token_rows(ids + draft, len(ids), f"{request_id}-x", SAMPLED_TOP_K)
    t = sampled.take(draft, rows, vllm_temperature(params.temperature), coin, engine.vocab_size)
    tokens = draft[: t.accepted]
    refused = t.refused
    while refused is not None or (tokens and _complete(engine, ids, tokens) < len(tokens)):
        if len(tokens) > t.accepted + MAX_CHAR_TOKENS:
            break
        seed = _seed_at(params.seed, len(ids) + len(tokens))
        tok = await engine.sample_token(
            ids + tokens, dataclasses.replace(params, seed=seed), f"{request_id}-t{len(tokens)}", refused
        )
        if tok is None:
            break
        tokens.append(tok)
        refused = None
    return Round(tokens=tokens, offered=len(draft), accepted=t.accepted)


def accepted_length(draft: Sequence[int], top: Sequence[int], leads: Sequence[float] = (), tie: float = 0.0) -> int:
    """How many of ``draft``'s tokens equal the target's argmax at their position (``top[i]``: the argmax
    where ``draft[i]`` stands), counted from the first: the tokens the target would write itself. A position
    whose argmax leads the runner-up by less than ``tie`` nats (``leads[i]``) ends the count: there a decode
    step may round to the other token (``TargetEngine.tie_nats``)."""
    n = 0
    for i, (d, t) in enumerate(zip(draft, top)):
        if d != t or (i < len(leads) and leads[i] < tie):
            break
        n += 1
    return n


@dataclass
class Round:
    """One round's check: the tokens the answer takes (the accepted ones, then the target's next), how
    many draft tokens were checked (``offered``) and taken (``accepted``)."""

    tokens: list[int]
    offered: int
    accepted: int


async def check_round(
    engine: TargetEngine, ids: list[int], drafts: Sequence[list[int]], request_id: str, max_checks: int = MAX_CHECKS
) -> Round:
    """The longest accepted prefix among ``drafts`` (each the target's tokens of a draft after ``ids``): the
    first checked, then each that extends the best so far (``max_checks`` checks in all; a draft that cannot
    extend it costs nothing)."""
    best: Round | None = None
    checks = 0
    for draft in (d for d in drafts if d):
        if best is not None:
            if checks >= max_checks:
                break
            k = best.accepted
            if len(best.tokens) <= k or len(draft) <= k or draft[: k + 1] != best.tokens[: k + 1]:
                continue  # differs where the best was taken, or at the target's next token: no further
        top, leads = await engine.top_tokens(ids + draft, len(ids), f"{request_id}-x{checks}")
        checks += 1
        k = accepted_length(draft, top, leads, engine.tie_nats)
        offered = (best.offered if best else 0) + len(draft)
        if best is None or k > best.accepted:
            # the target's token where the draft's was refused comes free, unless it wins by a tie
            free = [top[k]] if leads[k] >= engine.tie_nats else []
            best = Round(tokens=draft[:k] + free, offered=offered, accepted=k)
        else:
            best.offered = offered
    return best or Round(tokens=[], offered=0, accepted=0)


def stop_at(text: str, new: int, stops: Sequence[str]) -> int | None:
    """Where ``text`` ends at the first stop string that its last ``new`` characters complete (vLLM's rule:
    the text is cut before it); None where none is."""
    if not stops:
        return None
    window = max(len(s) for s in stops) + new
    start = max(0, len(text) - window)
    found = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(found) if found else None


def _complete(engine: TargetEngine, ids: list[int], tokens: list[int]) -> int:
    """How many of ``tokens`` end on a whole character (written after ``ids``): a run must not end inside
    one, whose bytes the next request would then read as prompt and never write."""
    decoder, n = engine.decoder(ids), 0
    for i, tok in enumerate(tokens):
        if decoder.step(tok) is not None:
            n = i + 1
    return n


class _Writer:
    """What a speculative generation has written: ids after the prompt, text, and where it ended."""

    def __init__(self, engine: TargetEngine, ids: list[int], params: GenParams, budget: int) -> None:
        self.engine, self.ids, self.params, self.budget = engine, list(ids), params, budget
        self.written, self.text, self.finish = 0, "", None
        self.stops = frozenset({engine.end_id, *engine.stop_ids} - {None})

    def run(self, tokens: list[int], accepted: int) -> list[Chunk]:
        """The chunks of a checked run (its first ``accepted`` tokens from a draft), cut at a stop token, a stop
        string or the budget; the run is written into ``ids``."""
        tokens = tokens[: self.budget - self.written]
        tokens = tokens[: _complete(self.engine, self.ids, tokens)]
        decoder, chunks = self.engine.decoder(self.ids), []
        for i, tok in enumerate(tokens):
            self.ids.append(tok)
            self.written += 1
            from_draft = int(i < accepted)
            if tok in self.stops:
                self.finish = "stop"
                chunks.append(Chunk("", 1, "stop", accepted=from_draft))
                return chunks
            delta = decoder.step(tok) or ""
            self.text += delta
            if (cut := stop_at(self.text, len(delta), self.params.stop)) is not None:
                delta = delta[: len(delta) - (len(self.text) - cut)]
                self.text, self.finish = self.text[:cut], "stop"
                chunks.append(Chunk(delta, 1, "stop", accepted=from_draft))
                return chunks
            last = self.written >= self.budget
            self.finish = "length" if last else None
            chunks.append(Chunk(delta, 1, self.finish, accepted=from_draft))
        return chunks


async def speculate(
    engine: TargetEngine,
    prompt: str,
    params: GenParams,
    request_id: str,
    proposals: Sequence[Proposal],
    more: More | None = None,
    later: AsyncIterator[Proposal] | None = None,
) -> AsyncIterator[Chunk]:
    """The target's generation of ``prompt`` (as ``engine.generate``), taking the tokens of ``proposals`` it
    would write itself (exact: greedy, unpenalised; otherwise, or with no proposals, the engine's own
    generation); ``more``: the next round of drafts once a round is taken (None: the target decodes the rest).
    Where ``engine.takes_drafts``, they and ``later`` ones are its own speculative proposals (``in_engine``)."""
    sampling = exact_sampled(engine, params)
    inside = engine.takes_drafts and (proposals or later is not None)
    whole = None  # a generation that is the whole answer: the engine's own, or one taking drafts inside it
    if not (proposals or inside) or not (sampling or exact(engine, params)):
        whole = engine.generate(prompt, params, request_id)
    elif inside:
        whole = in_engine(engine, prompt, params, request_id, proposals, later, more)
    if whole is not None:
        async with contextlib.aclosing(whole) as own:
            async for c in own:
                yield c
        return
    ids = await engine.prompt_ids(prompt)
    room = engine.max_model_len - len(ids) - 1  # a check reads one position past the draft
    w = _Writer(engine, ids, params, min(params.max_tokens, room))
    cost, n = current_cost(), 0
    coin = random.Random(params.seed).random if sampling else None  # the request's seed: the same coins again
    while proposals and w.finish is None:
        if coin is not None:  # one draft a round, chosen before any coin is drawn (the first: the greedy one)
            draft = await _ids(engine, proposals[0], room - w.written)
            checked = await check_sampled(engine, w.ids, draft, params, coin, f"{request_id}-s{n}")
        else:
            drafts = [await _ids(engine, p, room - w.written) for p in proposals]
            checked = await check_round(engine, w.ids, drafts, f"{request_id}-s{n}")
        if cost is not None:
            cost.draft_tokens_offered += checked.offered
        chunks = w.run(checked.tokens, checked.accepted)
        for c in chunks:
            if cost is not None:  # counted as the answer takes them (a caller may stop reading: a loop cut)
                cost.draft_tokens_accepted += c.accepted
            yield c
        n += 1
        if w.finish is not None or more is None or not chunks:
            break
        proposals = await more(w.text, checked.accepted)
    if w.finish is not None:
        return
    rest = dataclasses.replace(params, max_tokens=w.budget - w.written, stop=())
    if w.written:  # a seeded rest from another point: seeded apart from the checks'
        rest = dataclasses.replace(rest, seed=_seed_at(rest.seed, len(w.ids)))
    async with contextlib.aclosing(engine.generate_ids(w.ids, rest, f"{request_id}-rest")) as own:
        async for c in own:
            w.text += c.text
            if (cut := stop_at(w.text, len(c.text), params.stop)) is not None:
                yield Chunk(c.text[: len(c.text) - (len(w.text) - cut)], c.tokens, "stop")
                return
            yield c


DRY_STEPS = 4
"""Engine steps in a row that took no draft token before a generation taking drafts inside the engine asks for
drafts that continue its text (``More``): its proposals have run out or left the target's text."""


async def in_engine(
    engine: TargetEngine,
    prompt: str,
    params: GenParams,
    request_id: str,
    proposals: Sequence[Proposal],
    later: AsyncIterator[Proposal] | None,
    more: More | None = None,
) -> AsyncIterator[Chunk]:
    """One generation whose engine checks the proposals' tokens in its own steps (vLLM's speculative decoding
    with ``coinfer.cloud.draft_proposer``): no prefill of its own per check, no prompt re-read, one engine
    request; the tokens are the target's (its rejection sampler: greedy takes the argmax, a sampled request
    keeps the target's distribution). ``later`` proposals are sent to the generation as they come; where
    ``DRY_STEPS`` steps take nothing, ``more`` is asked for drafts that continue the text so far, sent as they
    come while the target goes on writing (the engine never waits for the edge)."""
    ids = await engine.prompt_ids(prompt)
    room = engine.max_model_len - len(ids)
    drafts = [await _ids(engine, p, room) for p in proposals]
    cost = current_cost()
    tasks: set[asyncio.Task] = set()
    if later is not None:
        tasks.add(asyncio.create_task(_send_later(engine, request_id, later, room)))
    asking: asyncio.Task | None = None
    text, dry, taken, accepted, offered, finished = "", 0, 0, 0, 0, False
    try:
        async with contextlib.aclosing(engine.generate_ids(ids, params, request_id, drafts=drafts)) as own:
            async for c in own:
                if cost is not None:  # counted as the answer takes them (a caller may stop reading: a loop cut)
                    cost.draft_tokens_accepted += c.accepted
                text += c.text
                taken += c.accepted
                accepted += c.accepted
                offered += c.offered
                finished = c.finish_reason is not None
                dry = 0 if c.accepted else dry + 1
                if (
                    more is not None
                    and dry >= DRY_STEPS
                    and c.finish_reason is None
                    and (asking is None or asking.done())
                ):
                    asking = asyncio.create_task(_send_more(engine, request_id, more, text, taken, room))
                    tasks.add(asking)
                    dry = taken = 0
                yield c
    finally:
        for tk in tasks:
            tk.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if cost is not None:
            task = asyncio.current_task()
            if not finished and not (task is not None and task.cancelling()):  # cut by its reader, not cancelled
                offered = accepted + await _refused(engine, request_id)
            offered = max(offered, accepted)
            cost.draft_tokens_offered += offered
            cost.scored_tokens += offered - accepted  # the positions the refused proposals took


REFUSED_WAIT_S = 0.5
"""How long a generation cut before its end waits for the proposer's count of the draft tokens it refused: the
engine answers between two steps; past this, none are counted."""


async def _refused(engine: TargetEngine, request_id: str) -> int:
    """The draft tokens generation ``request_id`` checked and refused, as the engine's proposer read them from its
    steps (the engine reports its own count on a generation's last chunk, which a reader that cut it never
    reads); 0 if unknown. ``asyncio.timeout``, not ``wait_for``: a cancellation that comes meanwhile stands."""
    try:
        async with asyncio.timeout(REFUSED_WAIT_S):
            return await engine.drafts_refused(request_id)
    except Exception:  # noqa: BLE001 - a count only: the answer stands without it
        log.info("no refused-draft count for generation %s", request_id, exc_info=True)
        return 0


async def _send_later(engine: TargetEngine, request_id: str, later: AsyncIterator[Proposal], room: int) -> None:
    """Each proposal of ``later`` to generation ``request_id`` as it comes (until cancelled or ``later`` ends)."""
    async for p in later:
        if not await _send(engine, request_id, [await _ids(engine, p, room)]):
            return


async def _send_more(engine: TargetEngine, request_id: str, more: More, text: str, taken: int, room: int) -> None:
    """``more``'s drafts that continue ``text`` (the generation's text so far; ``taken``: draft tokens it took
    since the last ask) to generation ``request_id``, each whole from the generation's start, so that the
    proposer finds where the answer, grown since, stands in it."""
    continued = await more(text, taken)
    await _send(engine, request_id, [await _ids(engine, Proposal(text + p.text, p.ended), room) for p in continued])


async def _send(engine: TargetEngine, request_id: str, drafts: list[list[int]]) -> bool:
    try:
        await engine.add_drafts(request_id, [d for d in drafts if d])
        return True
    except Exception:  # noqa: BLE001 - a proposal is only a guess: the generation goes on without it
        log.warning("drafts not sent to generation %s", request_id, exc_info=True)
        return False


async def _ids(engine: TargetEngine, p: Proposal, room: int) -> list[int]:
    """The target's tokens of proposal ``p`` (its end of turn after them where it ended), within ``room``."""
    ids = await engine.text_ids(p.text) if p.text else []
    if p.ended and engine.end_id is not None:
        ids = ids + [engine.end_id]
    return ids[: max(0, room)]
