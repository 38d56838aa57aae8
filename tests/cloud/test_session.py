"""The session as a coordinator, around a stand-in engine: the order of its events, the rounds' limits,
the deadline, the learner's rows (the answer policy itself: test_session_policy.py).

Sessions run on virtual time (tests/virtual_time.py): the engine's scripted delays, the rounds and the deadline
race exactly as written, however busy the machine."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from coinfer import types as t
from coinfer.cloud.config import CloudConfig, Limits, PolicyConfig
from coinfer.cloud.engine import Chunk
from coinfer.cloud.session import DraftsDone, Session
from coinfer.errors import DeadlineExceeded, InvalidArgument
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN
from tests.cloud.engines import LIKELIHOOD, RIGHT, GreedyWords, ScriptedEngine, TakingWords, apples, draft
from tests.virtual_time import run

PROSE = "The sky is blue because air molecules scatter blue sunlight more than red."


def _session(engine: ScriptedEngine, deadline_s: float = 10.0, drafts_on_request: bool = False, **policy) -> Session:
    req = t.OpenRequest(
        request_id="rid", task="", prompt="Explain why the sky is blue.", drafts_on_request=drafts_on_request
    )
    return Session(
        cfg=CloudConfig(limits=Limits(max_drafts=4), policy=PolicyConfig(**{**LIKELIHOOD, **policy})),
        engine=engine,
        req=req,
        task=OPEN,
        spec={},
        rules=RuleSet([], OPEN, {}),
        recommended_drafts=3,
        deadline_s=deadline_s,
    )


def _run(session: Session, items: list) -> list:
    async def inbox():
        for item in items:
            yield item

    async def go() -> list:
        return [ev async for ev in session.run(inbox())]

    return run(go())


def test_events_come_accepted_then_verdicts_then_the_answer_and_its_summary():
    engine = ScriptedEngine({PROSE: [-0.6] * 12}, reply="unused")
    events = _run(_session(engine), [draft(0, PROSE, own=-0.63), DraftsDone(1)])
    assert isinstance(events[0], t.SessionAccepted) and events[0].request_id == "rid"
    assert isinstance(events[1], t.Verdict) and events[1].valid
    assert events[2] == t.AnswerChunk(PROSE, True) and isinstance(events[-1], t.Summary) and len(events) == 4
    assert events[-1].timings.total_ms >= events[-1].timings.verify_ms > 0


def test_a_round_with_no_valid_draft_is_advised_a_retry_and_the_next_round_answers():
    engine = ScriptedEngine({PROSE: [-0.6] * 12}, reply="unused")
    events = _run(_session(engine), [draft(0, "bad"), DraftsDone(1), draft(1, PROSE, own=-0.63), DraftsDone(1)])
    (advice,) = [e for e in events if isinstance(e, t.RetryAdvice)]
    assert advice.attempt == 1 and advice.num_drafts == 3 and advice.reason.startswith("low_likelihood")
    assert events[-1].answer == PROSE


def test_a_round_that_miscounts_its_drafts_fails_the_session():
    with pytest.raises(InvalidArgument, match="done.count"):
        _run(_session(ScriptedEngine({}, reply="")), [draft(0, PROSE), DraftsDone(2)])


def test_the_deadline_with_no_verified_draft_and_nothing_shown_is_an_error():
    engine = ScriptedEngine({}, reply="word " * 50, delay_s=5.0)  # the cloud's first word comes after the deadline
    with pytest.raises(DeadlineExceeded, match="deadline_ms: session exceeded its 200 ms deadline"):
        _run(_session(engine, deadline_s=0.2), [])


class HeldWords(ScriptedEngine):
    """Streams its reply's first ``shown`` words at once, then holds the rest until the test ends: the session's
    deadline comes while the answer is half written (an order of events, not a race of timers)."""

    def __init__(self, reply: str, shown: int) -> None:
        super().__init__({}, reply=reply)
        self.shown = shown

    async def generate(self, prompt, params, request_id):
        words = self.reply.split(" ")
        for w in words[: self.shown]:
            yield Chunk(w + " ", 1)
        await asyncio.Event().wait()  # the rest never comes before the deadline


@pytest.mark.parametrize("verifier", ["likelihood", "exact"])
def test_at_the_deadline_text_streamed_as_final_is_kept_and_the_answer_begins_with_it(verifier):
    # issue 51, defect 1: a word problem whose valid draft is not taken as is (score 0.55 < 0.8), so the cloud
    # writes its own answer step by step, each step final; the deadline comes mid-answer. The best draft does
    # not begin with what was shown: the session used to withdraw the shown steps for it
    own = "Tom gets 3 * 4 = 12 apples.\nThen he has 5 + 12 = 17 apples.\nAnswer: 17"
    engine = HeldWords(own, shown=8)  # "Tom gets 3 * 4 = 12 apples.\nThen " written, the rest held
    engine.logprobs = {RIGHT: [-0.6] * 12}
    session = Session(
        cfg=CloudConfig(policy=PolicyConfig(verifier=verifier, hedge_below_odds=0.0)),
        engine=engine,
        req=apples(),
        task=OPEN,
        spec={},
        rules=RuleSet(apples().rules, OPEN, {}, extraction=apples().extraction),
        recommended_drafts=3,
        deadline_s=0.5,
    )
    events = _run(session, [draft(0, RIGHT, own=-0.63, num_tokens=30), DraftsDone(1)])
    assert not [e for e in events if isinstance(e, t.AnswerReset)]  # nothing final is withdrawn
    shown = "".join(e.text for e in events if isinstance(e, t.AnswerChunk))
    summary = events[-1]
    assert shown.startswith("Tom gets 3 * 4 = 12 apples.") and summary.answer == shown
    assert summary.refine_mode == t.RefineMode.DEADLINE and summary.finish_reason == t.FinishReason.LENGTH


def test_a_finished_session_leaves_the_learners_rows_when_learning_is_on():
    engine = ScriptedEngine({PROSE: [-0.6] * 12}, reply="unused")
    session = _session(engine)
    _run(session, [draft(0, PROSE, own=-0.63), DraftsDone(1)])
    ((score, agree, latency_s, label),) = session.outcome
    assert 0 < score < 1 and agree == 1.0 and latency_s >= 0 and label == 1.0  # agrees with the answer
    off = _session(engine, learn_every=0)
    _run(off, [draft(0, PROSE, own=-0.63), DraftsDone(1)])
    assert off.outcome == []


class SlowChecks(GreedyWords):
    """A greedy stand-in whose exact checks take ``check_s`` (virtual) seconds: drafts sent after the first arrive
    while it is checked."""

    def __init__(self, answer: str, check_s: float) -> None:
        super().__init__(answer)
        self.check_s = check_s

    async def top_tokens(self, ids, start, request_id):
        await asyncio.sleep(self.check_s)
        return await super().top_tokens(ids, start, request_id)


def test_an_exact_answer_continues_from_a_draft_in_hand_before_it_asks_the_edge_or_decodes():
    # the greedy draft ends early (edge.remote.GREEDY_DRAFT_TOKENS); the round's next draft, read while the first
    # is checked, continues the target's text: it is checked too, and the answer needs no decode and no DraftFrom
    engine = SlowChecks(PROSE, check_s=0.05)
    session = _session(engine, drafts_on_request=True, verifier="exact", hedge_below_odds=0.0)
    words = [" " + w for w in PROSE.split(" ")]  # the stand-in's text: a space before every word
    greedy = dataclasses.replace(draft(0, "".join(words[:5]), truncated=True), greedy=True)

    async def inbox():
        yield greedy
        await asyncio.sleep(0.02)  # written on after the greedy one ended: read while it is checked
        yield draft(1, "".join(words))
        yield DraftsDone(2)

    async def go() -> list:
        return [ev async for ev in session.run(inbox())]

    events = run(go())
    assert events[-1].answer == "".join(words)
    assert not [e for e in events if isinstance(e, t.DraftFrom)]
    assert engine.decoded == 0 and len(engine.checks) == 2


def test_inside_the_engine_an_exact_answer_begins_at_open_and_takes_the_drafts_as_they_come():
    # the target never waits for the edge: its generation starts before any draft, each draft reaches it when read
    engine = TakingWords(PROSE, k=4, step_s=0.01)
    session = _session(engine, verifier="exact", hedge_below_odds=0.0)
    words = [" " + w for w in PROSE.split(" ")]
    first_chunk_before_any_draft = []

    async def inbox():
        await asyncio.sleep(0.05)  # the edge's drafting
        first_chunk_before_any_draft.append(engine.steps > 0)
        yield dataclasses.replace(draft(0, "".join(words), truncated=False), greedy=True)
        yield DraftsDone(1)

    async def go() -> list:
        return [ev async for ev in session.run(inbox())]

    events = run(go())
    assert events[-1].answer == "".join(words) and events[-1].refine_mode is t.RefineMode.EXACT
    assert first_chunk_before_any_draft == [True]
    assert len(engine.request_ids) == 1 and engine.added  # one generation, the draft sent to it under way
    assert engine.steps < len(words)  # it took draft tokens: fewer steps than words
