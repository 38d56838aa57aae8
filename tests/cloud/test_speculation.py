"""Exact speculation around a token-level stand-in target (``GreedyWords``): what it takes from drafts is
what it would write itself, and its text is its own greedy text whatever the drafts say (the real engine:
tests/integration/test_exact_split.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coinfer.cloud.engine import GenParams, metered
from coinfer.cloud.speculation import Proposal, accepted_length, proposed, speculate
from tests.cloud.engines import GreedyWords, SampledWords, TakingWords

ANSWER = "the sky is blue because air scatters blue light"
PROMPT = "why blue sky"


def _run(engine: GreedyWords, proposals, params: GenParams | None = None, more=None):
    async def go():
        cost = metered()
        chunks = [c async for c in speculate(engine, PROMPT, params or GenParams(max_tokens=64), "r", proposals, more)]
        return chunks, cost

    return asyncio.run(go())


def _text(chunks) -> str:
    return "".join(c.text for c in chunks)


def _plain() -> str:
    chunks, _ = _run(GreedyWords(ANSWER), [])
    return _text(chunks)


def test_accepted_length_counts_the_draft_tokens_equal_to_the_argmax_from_the_first():
    assert accepted_length([1, 2, 3], [1, 2, 3, 9]) == 3
    assert accepted_length([1, 5, 3], [1, 2, 3, 9]) == 1
    assert accepted_length([], [4]) == 0


def test_a_draft_that_is_the_targets_own_answer_is_taken_whole_with_its_end_and_nothing_is_decoded():
    engine = GreedyWords(ANSWER)
    chunks, cost = _run(engine, [Proposal(" " + ANSWER, ended=True)])
    assert _text(chunks) == _plain() and chunks[-1].finish_reason == "stop"
    assert engine.decoded == 0 and len(engine.checks) == 1
    assert cost.draft_tokens_accepted == cost.draft_tokens_offered == len(ANSWER.split()) + 1  # its end too
    assert sum(c.accepted for c in chunks) == len(ANSWER.split()) + 1


def test_a_draft_that_differs_is_taken_up_to_there_the_targets_token_comes_free_and_the_rest_is_decoded():
    engine = GreedyWords(ANSWER)
    chunks, cost = _run(engine, [Proposal(" the sky is green because", ended=False)])
    assert _text(chunks) == _plain()
    assert cost.draft_tokens_accepted == 3 and cost.draft_tokens_offered == 5
    # "blue" came with the check; the rest (5 words and the end) was decoded
    assert engine.decoded == len(ANSWER.split()) - 4 + 1
    assert [c.accepted for c in chunks[:4]] == [1, 1, 1, 0]


def test_only_a_draft_that_can_be_taken_further_is_checked_too():
    engine = GreedyWords(ANSWER)
    first = Proposal(" the sky is green", ended=False)
    earlier = Proposal(" a sky is blue because air", ended=False)  # differs at once: never longer
    longer = Proposal(" the sky is blue because air scatters red", ended=False)
    chunks, cost = _run(engine, [first, earlier, longer])
    assert _text(chunks) == _plain()
    assert len(engine.checks) == 2 and cost.draft_tokens_accepted == 7


def test_a_near_tie_ends_what_is_taken_and_the_target_decodes_from_there():
    engine = GreedyWords(ANSWER)
    engine.tie_nats, engine.leads = 0.25, {3: 0.1}  # "blue" leads its runner-up by 0.1 nats
    chunks, cost = _run(engine, [Proposal(" " + ANSWER, ended=True)])
    assert _text(chunks) == _plain() and cost.draft_tokens_accepted == 3  # "the sky is", then decoded
    assert engine.decoded == len(ANSWER.split()) - 3 + 1
    engine = GreedyWords(ANSWER)
    engine.tie_nats, engine.leads = 0.25, {3: 0.1}
    chunks, cost = _run(engine, [Proposal(" the sky is green", ended=False)])
    assert cost.draft_tokens_accepted == 3 and engine.decoded == len(ANSWER.split()) - 3 + 1  # no free token


def test_a_penalised_or_nucleus_sampled_generation_is_the_engines_own():
    for params in (
        GenParams(max_tokens=64, temperature=0.7, top_p=0.9),
        GenParams(max_tokens=64, presence_penalty=0.5),
    ):
        engine = GreedyWords(ANSWER)
        chunks, cost = _run(engine, [Proposal(" " + ANSWER, ended=True)], params)
        assert engine.checks == [] and cost.draft_tokens_offered == 0 and _text(chunks) == _plain()


def test_the_token_budget_bounds_the_draft_tokens_taken_too():
    engine = GreedyWords(ANSWER)
    chunks, _ = _run(engine, [Proposal(" " + ANSWER, ended=True)], GenParams(max_tokens=4))
    assert _text(chunks) == " the sky is blue" and chunks[-1].finish_reason == "length" and engine.decoded == 0


def test_a_stop_string_in_the_taken_tokens_ends_the_text_before_it():
    engine = GreedyWords(ANSWER)
    chunks, _ = _run(engine, [Proposal(" " + ANSWER, ended=True)], GenParams(max_tokens=64, stop=(" because",)))
    assert _text(chunks) == " the sky is blue" and chunks[-1].finish_reason == "stop"


def test_another_round_of_drafts_continues_from_the_targets_text():
    engine = GreedyWords(ANSWER)
    asked: list[tuple[str, int]] = []

    async def more(text: str, accepted: int):
        asked.append((text, accepted))
        return [Proposal(" scatters blue light", ended=True)] if len(asked) == 1 else []

    chunks, cost = _run(engine, [Proposal(" the sky is blue because", ended=False)], more=more)
    assert _text(chunks) == _plain()
    # round 1 took 5 words and "air" came free; round 2 continued "... because air" to the end
    assert asked == [(" the sky is blue because air", 5)] and engine.decoded == 0
    assert cost.draft_tokens_accepted == 5 + 4


WORDS = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=200, deadline=None)
@given(
    answer=st.lists(WORDS, min_size=1, max_size=12),
    drafts=st.lists(st.tuples(st.lists(WORDS, max_size=14), st.booleans()), max_size=4),
    budget=st.integers(1, 16),
)
def test_whatever_the_drafts_the_text_is_the_targets_own(answer, drafts, budget):
    text = " ".join(answer)
    engine = GreedyWords(text)
    proposals = [Proposal(" " + " ".join(w) if w else "", ended) for w, ended in drafts]
    plain, _ = _run(GreedyWords(text), [], GenParams(max_tokens=budget))
    chunks, cost = _run(engine, proposals, GenParams(max_tokens=budget))
    assert _text(chunks) == _text(plain)
    assert [c.finish_reason for c in chunks][-1] == [c.finish_reason for c in plain][-1]
    assert sum(c.tokens for c in chunks) == sum(c.tokens for c in plain)  # every token written once
    assert cost.draft_tokens_accepted <= cost.draft_tokens_offered


def test_continuation_asks_again_until_misses_in_a_row_or_rounds_run_out():
    from coinfer.cloud.speculation import Continuation

    one = Continuation(rounds=8, min_accepted=4, misses=1)  # one miss ends it
    assert [one.ask(a) for a in (10, 5, 3, 30)] == [True, True, False, False]
    assert one.asked == 2

    two = Continuation(rounds=8, min_accepted=4, misses=2)  # a miss then a take: the count starts again
    assert [two.ask(a) for a in (0, 30, 1, 2, 30)] == [True, True, True, False, False]
    assert two.asked == 3

    few = Continuation(rounds=2, min_accepted=0, misses=1)  # min_accepted 0: no round is a miss
    assert [few.ask(a) for a in (0, 0, 0)] == [True, True, False] and few.asked == 2


def _sampled(engine: SampledWords, draft: str, params: GenParams, more=None):
    async def go():
        cost = metered()
        chunks = [c async for c in speculate(engine, PROMPT, params, "r", [Proposal(draft, ended=False)], more)]
        return chunks, cost

    return asyncio.run(go())


def _exact_law(engine: SampledWords, budget: int, temperature: float) -> dict[str, float]:
    """The chain's own distribution of whole answers of at most ``budget`` tokens (by enumeration)."""
    law: dict[str, float] = {}

    def walk(ids: list[int], text: str, p: float) -> None:
        if len(ids) - engine.prompt_words == budget:
            law[text] = law.get(text, 0.0) + p
            return
        for tok, q in engine.dist(ids, temperature).items():
            if tok == engine.END:
                law[text] = law.get(text, 0.0) + p * q
            else:
                walk(ids + [tok], text + " " + engine.word(tok), p * q)

    walk(asyncio.run(engine.prompt_ids(PROMPT)), "", 1.0)
    return law


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_sampled_generation_takes_draft_tokens_and_keeps_the_targets_distribution(temperature):
    """3 000 seeded answers of 3 tokens with a draft the chain finds likely at first, then not: the answers'
    frequencies against the chain's own law (a frequency's standard error <= 0.009; a bias such as sampling
    the refused token's place without excluding it moves one by ~0.1)."""
    params = GenParams(max_tokens=3, temperature=temperature)
    law = _exact_law(SampledWords(), 3, temperature)
    counts: dict[str, int] = {}
    taken = offered = 0
    runs = 3000
    for seed in range(runs):
        engine = SampledWords()
        chunks, cost = _sampled(engine, " a b a", dataclasses.replace(params, seed=seed))
        text = _text(chunks)
        counts[text] = counts.get(text, 0) + 1
        taken, offered = taken + cost.draft_tokens_accepted, offered + cost.draft_tokens_offered
    assert set(counts) <= set(law)
    worst = max(abs(counts.get(k, 0) / runs - p) for k, p in law.items())
    assert worst < 0.03, (worst, counts, law)
    assert 0 < taken < offered  # tokens were taken, and refused


def test_a_refused_token_is_never_the_targets_next_one_and_the_rest_is_sampled():
    engine = SampledWords()
    chunks, cost = _sampled(engine, " c c c", GenParams(max_tokens=6, temperature=1.0, seed=5))
    assert engine.checks and cost.draft_tokens_offered == 3
    k = cost.draft_tokens_accepted
    words = _text(chunks).split()
    if k < 3 and len(words) > k:  # refused at k: the token written there is another
        assert words[k] != "c" and engine.sampled >= 1
    assert sum(c.tokens for c in chunks) <= 6


def test_a_drafts_calculator_repair_is_offered_before_it_and_each_text_once():
    def repair(text: str) -> str | None:
        return text.replace("= 5", "= 4") if "= 5" in text else None

    got = proposed([("2 + 2 = 5.", True), ("2 + 2 = 4.", True), ("2 + 2 = 5.", False), ("so", False)], repair)
    assert got == [Proposal("2 + 2 = 4.", True), Proposal("2 + 2 = 5.", True), Proposal("so", False)]
    assert proposed([("2 + 2 = 5.", True)], None) == [Proposal("2 + 2 = 5.", True)]


def test_drafts_that_cannot_be_taken_further_cost_no_check_of_the_limit():
    # three checks at most: the drafts that differ where the first was refused are skipped, not counted, so the
    # fifth draft, which extends it, is still checked
    engine = GreedyWords(ANSWER)
    first = Proposal(" the sky is green", ended=False)
    skipped = [Proposal(f" a sky {i}", ended=False) for i in range(3)]
    longer = Proposal(" the sky is blue because air scatters red", ended=False)
    chunks, cost = _run(engine, [first, *skipped, longer])
    assert _text(chunks) == _plain()
    assert len(engine.checks) == 2 and cost.draft_tokens_accepted == 7


def _run_taking(engine, proposals, later=(), more=None, max_tokens=64):
    async def go():
        async def arriving():
            for p in later:
                await asyncio.sleep(0)
                yield p

        cost = metered()
        stream = speculate(engine, PROMPT, GenParams(max_tokens=max_tokens), "r", proposals, more, arriving())
        return [c async for c in stream], cost

    return asyncio.run(go())


@settings(max_examples=100, deadline=None)
@given(
    answer=st.lists(WORDS, min_size=1, max_size=12),
    drafts=st.lists(st.lists(WORDS, max_size=14), min_size=1, max_size=3),
    budget=st.integers(1, 16),
)
def test_inside_the_engine_whatever_the_drafts_the_text_is_the_targets_own(answer, drafts, budget):
    text = " ".join(answer)
    plain = _text(_run(GreedyWords(text), [], GenParams(max_tokens=budget))[0])
    proposals = [Proposal(" " + " ".join(d), ended=False) for d in drafts]
    chunks, cost = _run_taking(TakingWords(text), proposals[:1], later=proposals[1:], max_tokens=budget)
    assert _text(chunks) == plain
    assert cost.engine_requests == 0 or cost.draft_tokens_offered >= cost.draft_tokens_accepted
    assert cost.scored_tokens == cost.draft_tokens_offered - cost.draft_tokens_accepted


def test_inside_the_engine_later_drafts_reach_the_generation_and_its_steps_take_them():
    engine = TakingWords(ANSWER, k=4)
    chunks, cost = _run_taking(
        engine, [Proposal(" the sky", ended=False)], later=[Proposal(ANSWER_PROPOSAL, ended=True)]
    )
    assert _text(chunks) == _plain()
    assert engine.added and engine.request_ids == ["r"]  # one generation; the later draft sent to it
    assert cost.draft_tokens_accepted > 2 and engine.steps < len(ANSWER.split())


ANSWER_PROPOSAL = " " + ANSWER


def test_inside_the_engine_steps_that_take_nothing_ask_for_drafts_that_continue_the_text():
    engine = TakingWords(ANSWER, k=4)
    asked: list[str] = []

    async def more(text: str, accepted: int):
        asked.append(text)
        return [Proposal(ANSWER_PROPOSAL[len(text) :], ended=True)]

    chunks, cost = _run_taking(engine, [Proposal(" the", ended=False)], more=more)
    assert _text(chunks) == _plain()
    # four steps in a row took nothing ("the" then "sky is blue" decoded): the text so far was asked to continue,
    # and the continuation sent whole from the generation's start, so that the answer, grown since, finds itself in it
    assert asked == [" the sky is blue"]
    assert engine.added == [[asyncio.run(engine.text_ids(ANSWER_PROPOSAL)) + [engine.END]]]  # it ended: its end too
    assert cost.draft_tokens_accepted > 0 and engine.steps < len(ANSWER.split()) + 1


def test_inside_the_engine_a_generation_its_reader_cuts_counts_the_proposals_the_engine_refused():
    # the engine's own count comes on a generation's last chunk, which a reader that stops early (the writer's
    # loop cut) never reads: the proposer's count stands in, so the refused proposals' positions are not lost
    engine = TakingWords(ANSWER, k=4)
    wrong = Proposal(" the sky is green because air scatters blue light", ended=True)

    async def go():
        cost = metered()
        chunks = []
        async with contextlib.aclosing(
            speculate(engine, PROMPT, GenParams(max_tokens=64), "r", [wrong], None, None)
        ) as stream:
            async for c in stream:
                chunks.append(c)
                if len(chunks) == 6:
                    break
        return chunks, cost

    chunks, cost = asyncio.run(go())
    assert all(c.finish_reason is None for c in chunks)  # cut before the last chunk
    assert cost.draft_tokens_offered > cost.draft_tokens_accepted > 0  # "green" and what the step after it proposed
    assert cost.scored_tokens == cost.draft_tokens_offered - cost.draft_tokens_accepted
