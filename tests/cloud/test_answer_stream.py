"""AnswerStream: the one record of what the client was shown, and the events in order."""

from __future__ import annotations

import asyncio

import pytest

from coinfer import types as t
from coinfer.cloud.answer_stream import AnswerStream
from tests.streams import shown


def _events(stream: AnswerStream) -> list:
    async def read() -> list:
        return [ev async for ev in stream.events()]

    return asyncio.run(read())


def test_chunks_add_to_what_was_shown_and_a_withdrawal_clears_it():
    s = AnswerStream()
    s.chunk("a ", final=True)
    s.chunk("b")
    assert s.shown == "a b"
    s.withdraw("wrong")
    s.withdraw("nothing shown: no second reset")
    assert s.shown == ""
    s.end()
    events = _events(s)
    assert events == [t.AnswerChunk("a ", True), t.AnswerChunk("b", False), t.AnswerReset("wrong")]


def test_replace_streams_the_answer_once_and_only_where_it_differs():
    s = AnswerStream()
    s.chunk("draft")
    s.replace("draft", "same text: nothing to do")
    s.replace("answer", "refinement rejected")
    assert s.shown == "answer"
    s.end()
    events = _events(s)
    assert events == [t.AnswerChunk("draft"), t.AnswerReset("refinement rejected"), t.AnswerChunk("answer", True)]
    assert shown(events) == "answer"
    # nothing shown yet: the answer streams with no reset before it
    s = AnswerStream()
    s.replace("answer", "unused")
    s.end()
    assert _events(s) == [t.AnswerChunk("answer", True)]


def test_other_events_keep_their_order_and_answer_text_cannot_bypass_the_record():
    s = AnswerStream()
    v = t.Verdict(draft_index=0, valid=True)
    s.put(v)
    s.chunk("x")
    with pytest.raises(TypeError):
        s.put(t.AnswerChunk("y"))
    with pytest.raises(TypeError):
        s.put(t.AnswerReset("z"))
    s.end()
    assert _events(s) == [v, t.AnswerChunk("x")] and s.shown == "x"


def test_a_failure_is_raised_after_the_events_before_it():
    s = AnswerStream()
    s.chunk("partial")
    s.fail(ValueError("boom"))
    seen: list = []

    async def read() -> None:
        async for ev in s.events():
            seen.append(ev)

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(read())
    assert seen == [t.AnswerChunk("partial")]
