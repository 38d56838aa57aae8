"""The target writing an answer to the client: its generation streamed chunk by chunk through the
session's ``AnswerStream``, each chunk marked final or held, and stopped where it falls into a loop.

Or step by step (``check``): where the request's rules can judge an answer's steps
(``RuleSet.streams_steps``), each step the target completes (``coinfer.steps.step_ends``) is checked
and only then streamed, as final; the first step that fails stops the generation unshown, and the
caller continues from the last good step (``coinfer.cloud.alone``). With ``grow``
(``RuleSet.step_shown``, ``coinfer.steps``) a step streams as it grows, as far as nothing the model
writes next can make it fail, or the caller can end it rightly (a preset's calculator): nothing shown
is ever withdrawn, and the first content leaves with the first token rather than the first step. From the step where the answer's
end begins (the check says None: a preset's ``answer ...``, an extraction's marker) the rest is held,
for the caller to check with the whole answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from coinfer import types as t
from coinfer.cloud.answer import finish_reason
from coinfer.cloud.answer_stream import AnswerStream
from coinfer.cloud.context import SessionContext
from coinfer.cloud.engine import Chunk, GenParams
from coinfer.cloud.ranking import MS_PER_S
from coinfer.cloud.speculation import More, Proposal, speculate
from coinfer.repetition import repetition_error
from coinfer.steps import step_ends

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
    decoded and why it ended; written step by step, ``error``: why its last step failed (the text
    ends with that step, unshown; '' when none failed)."""

    text: str
    ttft_ms: float
    tokens: int
    finish: t.FinishReason
    error: str = ""
    accepted: int = 0
    """Of ``tokens``, those taken from drafts the target checked (``coinfer.cloud.speculation``)."""


class Writer:
    """Streams the target's generations for one session."""

    def __init__(self, ctx: SessionContext, stream: AnswerStream) -> None:
        self.ctx, self.stream = ctx, stream

    async def write(
        self,
        prompt: str,
        prefix: str,
        max_tokens: int,
        tag: str,
        final: Callable[[str], bool] = never,
        *,
        check: Callable[[str], str | None] | None = None,
        max_chars: float = math.inf,
        params: GenParams | None = None,
        grow: Callable[[str], int | None] | None = None,
        proposals: Sequence[Proposal] = (),
        more: More | None = None,
        later: AsyncIterator[Proposal] | None = None,
    ) -> Written:
        """Stream the target's answer to ``prompt`` after ``prefix`` (streamed first), each chunk final
        when ``final`` holds for the text so far. A generation that falls into a loop is stopped there
        (checked every ``LOOP_CHECK_TOKENS``; finish "repetition"): the rules would refuse it anyway, and
        SmolLM2's looping greedy haiku otherwise ran to its 192-token budget before candidates began.

        With ``check`` (the error of a prefix that ends a step, '' when it passes, None where the
        answer's end begins), step by step instead: ``prefix`` begins with what the stream has shown, and
        each completed step after that is checked and streamed as final; the first that fails stops the
        generation (``Written.error``), as does passing ``max_chars`` (finish "length"). What follows the
        last step streamed stays unshown (from a None on, every step): the caller checks it with the
        whole answer. ``params``: the sampling (default: the request's). ``grow`` (with ``check``):
        how much of the step in progress may stream before it ends (None: no more until it ends); a
        failed step may then end with text shown: the caller continues from what the stream shows.

        ``proposals``: drafts of the whole answer; those that begin with ``prefix`` offer the target the rest of
        their text, which it takes where it would write the same tokens (``coinfer.cloud.speculation``: the
        text is the target's own); ``more``: the next round of such drafts (whole answers) once one is taken;
        ``later``: drafts still to come, sent to the generation as they come (an engine that takes drafts)."""
        t_start = time.perf_counter()
        steps = _Steps(self.stream, prefix, check, max_chars, grow) if check else None
        if steps is None and prefix:
            self.stream.chunk(prefix, final(prefix))
        if steps and (error := await steps.advance(prefix)):  # a prefix's own step failed: nothing to write
            return Written(text=prefix[: steps.failed], ttft_ms=0.0, tokens=0, finish=t.FinishReason.STOP, error=error)
        params = params or self.ctx.params(max_tokens)
        if params.max_tokens < 1:  # the answer's budget is spent (a step corrected at its end): nothing to write
            return Written(text=prefix, ttft_ms=0.0, tokens=0, finish=t.FinishReason.LENGTH)
        stream = speculate(
            self.ctx.engine,
            prompt + prefix,
            params,
            self.ctx.request_id(tag),
            after(proposals, prefix),
            _after_more(more, prefix) if more is not None else None,
            _after_later(later, prefix) if later is not None else None,
        )
        async with contextlib.aclosing(stream):  # leaving early closes it: the engine aborts the request
            return await self._streamed(stream, t_start, prefix, final, steps, max_chars)

    async def _streamed(
        self,
        stream: AsyncIterator[Chunk],
        t_start: float,
        text: str,
        final: Callable[[str], bool],
        steps: _Steps | None,
        max_chars: float,
    ) -> Written:
        """The generation ``stream`` after ``text``, streamed chunk by chunk (``final``) or step by step
        (``steps``), until it ends, a step fails, it passes ``max_chars`` or it falls into a loop."""
        ttft, tokens, accepted, finish, checked, error = 0.0, 0, 0, t.FinishReason.STOP, 0, ""
        async for delta in stream:
            if not ttft:
                ttft = (time.perf_counter() - t_start) * MS_PER_S
            tokens += delta.tokens
            accepted += delta.accepted
            finish = finish_reason(delta.finish_reason, finish)
            if delta.text:
                text += delta.text
                if steps is None:
                    self.stream.chunk(delta.text, final(text))
                elif error := await steps.advance(text):
                    text = text[: steps.failed]  # the failed step ends the text
                    break
                elif len(text) > max_chars:
                    finish = t.FinishReason.LENGTH
                    break
            if tokens - checked >= LOOP_CHECK_TOKENS and delta.finish_reason is None:
                checked = tokens
                if repetition_error(text):  # linear in the text, which is bounded by max_tokens
                    finish = t.FinishReason.REPETITION
                    break
        return Written(text=text, ttft_ms=ttft, tokens=tokens, finish=finish, error=error, accepted=accepted)


def after(proposals: Sequence[Proposal], prefix: str) -> list[Proposal]:
    """What drafts of the whole answer propose after ``prefix``: the rest of those that begin with it."""
    return [
        Proposal(p.text[len(prefix) :], p.ended)
        for p in proposals
        if p.text.startswith(prefix) and (len(p.text) > len(prefix) or p.ended)
    ]


def _after_more(more: More, prefix: str) -> More:
    """``more`` for a generation that began after ``prefix``: it asks for drafts of the whole answer."""

    async def here(text: str, accepted: int) -> list[Proposal]:
        return after(await more(prefix + text, accepted), prefix + text)

    return here


async def _after_later(later: AsyncIterator[Proposal], prefix: str) -> AsyncIterator[Proposal]:
    """``later``'s proposals for a generation that began after ``prefix`` (``after``)."""
    async with contextlib.aclosing(later):
        async for p in later:
            for q in after([p], prefix):
                yield q


class _Steps:
    """A step-by-step write's progress: what the stream shows (``good``), where its last checked step
    ends (``step``: ``good`` unless the step in progress streams as it grows), where its failed step ends
    (``failed``), how far step ends were looked for (``scanned``), whether the step in progress may still
    stream as it grows (``growing``), and whether the answer's end has begun (``held``: nothing more is
    checked or shown)."""

    def __init__(
        self,
        stream: AnswerStream,
        prefix: str,
        check: Callable[[str], str | None],
        max_chars: float,
        grow: Callable[[str], int | None] | None = None,
    ) -> None:
        assert prefix.startswith(stream.shown), "a step-by-step write continues what the stream shows"
        self.stream, self.check, self.max_chars, self.grow = stream, check, max_chars, grow
        self.good = self.failed = self.scanned = len(stream.shown)
        self.step = shown_step_start(stream.shown)
        self.held, self.growing = False, grow is not None

    async def advance(self, text: str) -> str:
        """Check the steps ``text`` completes past the checked text (within ``max_chars``), in order,
        streaming each that passes as final; the error of the first that fails ('' when none does).
        Client rules: off the loop."""
        if self.held:
            return ""
        ends = [e for e in step_ends(text, max(self.step, self.scanned)) if e <= self.max_chars]
        self.scanned = len(text) - 1  # a last "." ends a sentence only once a space follows it
        for end in ends:
            err = await asyncio.to_thread(self.check, text[:end])
            if err is None:  # the answer's end has begun: held from here for the whole answer's rules
                self.held = True
                return ""
            if err:
                self.failed = end
                return err
            self.stream.chunk(text[self.good : end], final=True)
            self.good = self.step = end
            self.growing = self.grow is not None
        if self.growing and len(text) > self.good and text[self.step :].strip():  # a space begins no step yet
            # bounded (coinfer.steps: a step read up to a few hundred characters): on the loop, once per delta
            n = self.grow(text[self.step :]) if len(text) <= self.max_chars else None
            if n is None:  # no more of this step leaves before it ends, whatever follows
                self.growing = False
            elif self.step + n > self.good:
                self.stream.chunk(text[self.good : self.step + n], final=True)
                self.good = self.step + n
        return ""


def shown_step_start(shown: str) -> int:
    """Where the step the stream shows begun starts: after its last step's end (0: none ended)."""
    ends = step_ends(shown)
    return ends[-1] if ends else 0
