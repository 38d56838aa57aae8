"""The target writing an answer to the client: its generation streamed chunk by chunk through the
session's ``AnswerStream``, each chunk marked final or held, and stopped where it falls into a loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from coinfer import types as t
from coinfer.cloud.answer import finish_reason
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.context import SessionContext
from coinfer.cloud.ranking import MS_PER_S
from coinfer.repetition import repetition_error

LOOP_CHECK_TOKENS = 16
"""How often (in generated tokens) the cloud's own generation is checked for a loop: often enough to
stop a loop within a few words, rarely enough that the check (linear in the text) costs nothing."""


def never(text: str) -> bool:
    """No text is final (held until the answer is decided)."""
    return False


def always(text: str) -> bool:
    """Every text is final (the answer is kept whatever follows)."""
    return True


@dataclass(kw_only=True)
class Written:
    """What a generation wrote: the text (prefix included), its time to first token, the tokens it
    decoded and why it ended."""

    text: str
    ttft_ms: float
    tokens: int
    finish: t.FinishReason


class Writer:
    """Streams the target's generations for one session."""

    def __init__(self, ctx: SessionContext, stream: AnswerStream) -> None:
        self.ctx, self.stream = ctx, stream

    async def write(
        self, prompt: str, prefix: str, max_tokens: int, tag: str, final: Callable[[str], bool] = never
    ) -> Written:
        """Stream the target's answer to ``prompt`` after ``prefix`` (streamed first), each chunk final
        when ``final`` holds for the text so far. A generation that falls into a loop is stopped there
        (checked every ``LOOP_CHECK_TOKENS``; finish "repetition"): the rules would refuse it anyway, and
        SmolLM2's looping greedy haiku otherwise ran to its 192-token budget before candidates began."""
        t_start, ttft = time.perf_counter(), 0.0
        if prefix:
            self.stream.chunk(prefix, final(prefix))
        text, tokens, finish, checked = prefix, 0, t.FinishReason.STOP, 0
        stream = self.ctx.engine.generate(prompt + prefix, self.ctx.params(max_tokens), self.ctx.request_id(tag))
        async with contextlib.aclosing(stream):  # leaving early closes it: the engine aborts the request
            async for delta in stream:
                if not ttft:
                    ttft = (time.perf_counter() - t_start) * MS_PER_S
                tokens += delta.tokens
                finish = finish_reason(delta.finish_reason, finish)
                if delta.text:
                    text += delta.text
                    self.stream.chunk(delta.text, final(text))
                if tokens - checked >= LOOP_CHECK_TOKENS and delta.finish_reason is None:
                    checked = tokens
                    if repetition_error(text):  # linear in the text, which is bounded by max_tokens
                        finish = t.FinishReason.REPETITION
                        break
        return Written(text=text, ttft_ms=ttft, tokens=tokens, finish=finish)
