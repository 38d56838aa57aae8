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


def _stepwise(engine: ScriptedEngine, check, prefix: str = "", max_chars: float = float("inf"), grow=None):
    stream = AnswerStream()
    writer = Writer(context(engine), stream)
    w = asyncio.run(writer.write("PROMPT ", prefix, 64, "r0", check=check, max_chars=max_chars, grow=grow))
    stream.end()

    async def read() -> list:
        return [ev async for ev in stream.events()]

    return w, asyncio.run(read()), stream


def _no_darn(text: str) -> str:
    return "forbidden" if "darn" in text else ""


def test_step_by_step_each_checked_step_streams_as_final_and_the_rest_waits():
    engine = ScriptedEngine({}, reply="It is blue.\nAir scatters light; mostly blue")
    w, events, stream = _stepwise(engine, _no_darn)
    assert [(e.text, e.final) for e in events] == [("It is blue.", True), ("\n", True), ("Air scatters light;", True)]
    assert w.text == "It is blue.\nAir scatters light; mostly blue" and not w.error  # the rest: the caller's
    assert stream.shown == "It is blue.\nAir scatters light;"


def test_step_by_step_a_failing_step_stops_the_generation_unshown():
    engine = ScriptedEngine({}, reply="It is blue. A darn fine blue. More words follow here.")
    w, events, stream = _stepwise(engine, _no_darn)
    assert stream.shown == "It is blue." == "".join(e.text for e in events) and all(e.final for e in events)
    assert w.text == "It is blue. A darn fine blue." and w.error == "forbidden"  # ends with the failed step
    assert engine.generated == len(w.text.split())  # stopped there: the engine aborts the rest


def test_step_by_step_the_writer_stops_past_max_chars():
    engine = ScriptedEngine({}, reply="One. Two. Three. Four. Five.")
    w, _, stream = _stepwise(engine, _no_darn, max_chars=10)
    assert w.finish is t.FinishReason.LENGTH and stream.shown == "One. Two." and len(w.text) > 10


def _until_answer(text: str) -> str | None:
    """A check that holds from the answer on (None), as a preset's does."""
    return None if "Answer" in text else _no_darn(text)


def test_step_by_step_from_where_the_answer_begins_the_rest_is_held_unchecked():
    engine = ScriptedEngine({}, reply="It is blue.\nAnswer: blue.\nA darn fine blue. More.")
    w, events, stream = _stepwise(engine, _until_answer)
    assert stream.shown == "It is blue.\n" and all(e.final for e in events)
    assert w.text == "It is blue.\nAnswer: blue.\nA darn fine blue. More." and not w.error  # whole: the caller's


def _ends_abcd(partial: str) -> int | None:
    """All of a step begun as a prefix of ``abcd`` (spaces aside) may leave: a calculator could end it."""
    return len(partial) if "abcd".startswith("".join(partial.split())) else None


def test_step_by_step_a_step_streams_as_it_grows_while_the_calculator_can_end_it():
    engine = ScriptedEngine({}, reply="ab cd; ab cx dd; ab xy; more")
    w, events, stream = _stepwise(engine, lambda text: "bad" if "xy" in text else "", grow=_ends_abcd)
    assert [(e.text, e.final) for e in events] == [
        ("ab ", True),  # the step's beginning: the calculator could end it
        ("cd;", True),  # the rest once it ends and passes
        (" ab ", True),  # a space alone begins no step: it leaves with what follows
        ("cx dd;", True),  # "abcx" begins no step the calculator ends: held until the step ends, then checked
        (" ab ", True),
    ]
    assert w.error == "bad" and w.text == "ab cd; ab cx dd; ab xy;" and stream.shown == "ab cd; ab cx dd; ab "
