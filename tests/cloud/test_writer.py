"""The writer alone: the target's generation streamed through the answer stream, final where asked,
stopped where it falls into a loop."""

from __future__ import annotations

import asyncio

from coinfer import types as t
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.writer import LOOP_CHECK_TOKENS, Writer, always
from tests.cloud.engines import ScriptedEngine, context


def _write(engine: ScriptedEngine, prefix: str = "", final=None, max_tokens: int = 64):
    stream = AnswerStream()
    writer = Writer(context(engine), stream)
    kw = {} if final is None else {"final": final}
    w = asyncio.run(writer.write("PROMPT ", prefix, max_tokens, "r0", **kw))
    stream.end()

    async def read() -> list:
        return [ev async for ev in stream.events()]

    return w, asyncio.run(read()), stream, writer


def test_the_prefix_streams_first_and_the_generation_after_it():
    engine = ScriptedEngine({}, reply="is 17.", finish="length")
    w, events, stream, writer = _write(engine, prefix="The answer ")
    assert w.text == "The answer is 17." == stream.shown and w.tokens == 2 and w.ttft_ms > 0
    assert w.finish is t.FinishReason.LENGTH
    assert [e.text for e in events] == ["The answer ", "is ", "17."] and not any(e.final for e in events)
    assert engine.prompts == ["PROMPT The answer "] and engine.request_ids == [writer.ctx.request_id("r0")]


def test_chunks_are_final_while_the_text_so_far_says_so():
    engine = ScriptedEngine({}, reply="b c")
    _, events, _, _ = _write(engine, prefix="a ", final="a b d".startswith)
    assert [(e.text, e.final) for e in events] == [("a ", True), ("b ", True), ("c", False)]
    _, events, _, _ = _write(ScriptedEngine({}, reply="x"), final=always)
    assert all(e.final for e in events)


def test_a_generation_that_falls_into_a_loop_is_stopped_at_the_next_check():
    engine = ScriptedEngine({}, reply=" ".join(["a leaf falls"] * 60))
    w, _, _, _ = _write(engine, max_tokens=512)
    assert w.finish is t.FinishReason.REPETITION
    assert w.tokens % LOOP_CHECK_TOKENS == 0 and w.tokens < 180 and engine.generated == w.tokens
