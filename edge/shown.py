"""What the user has seen of one answer on the edge: the one object that owns it (the pipeline asks it
whether a fallback must withdraw streamed text and where a local answer must begin, the lifecycle
whether the answer still has to be sent whole, the HTTP stream what may leave now).

Two views of the same chunks: ``text``, the answer streamed since the last ``AnswerReset`` (what a
gRPC ``Solve`` client that honours resets shows), and ``final``, the text that left where nothing can
be taken back (an OpenAI stream): a chunk marked final commits the text since the last reset up to its
end, provided it extends what was committed (a replay's own answer after a failure repeats it)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from coinfer import types as t


@dataclass
class AnswerView:
    text: str = ""
    """The answer streamed since the last reset."""
    final: str = ""
    """The committed text: never withdrawn, every answer of the request begins with it."""
    first_chunk_at: float | None = None
    """``time.perf_counter()`` of the first answer chunk (the time to first content)."""

    @property
    def streamed(self) -> bool:
        """Some answer text stands streamed (a reset withdraws it)."""
        return bool(self.text)

    def see(self, ev: object) -> str:
        """Take an event in; returns the text it commits ("" for none, or for an event that is no
        answer text)."""
        if isinstance(ev, t.AnswerChunk):
            if self.first_chunk_at is None:
                self.first_chunk_at = time.perf_counter()
            return self._chunk(ev)
        if isinstance(ev, t.AnswerReset):
            self.text = ""
        return ""

    def _chunk(self, ev: t.AnswerChunk) -> str:
        self.text += ev.text
        # text that does not extend what was committed (a replay's own answer) waits for the answer
        if not ev.final or len(self.text) <= len(self.final) or not self.text.startswith(self.final):
            return ""
        new, self.final = self.text[len(self.final) :], self.text
        return new

    def rest(self, answer: str) -> str | None:
        """Commit ``answer``: the part of it still to send; None when the committed text does not begin
        it (the answer came from elsewhere and cannot be sent over it)."""
        if not answer.startswith(self.final):
            return None
        rest, self.final = answer[len(self.final) :], answer
        return rest
