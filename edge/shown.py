"""What the user has seen of one answer on the edge: the one object that owns it, one per request, held by its
lifecycle (``edge/lifecycle.py``: the pipeline feeds it every event it emits and asks it whether a fallback must
withdraw streamed text and where a local answer must begin, the lifecycle whether the answer still has to be
sent whole, the HTTP stream what may leave now).

Two views of the same chunks: ``text``, the answer streamed since the last ``AnswerReset`` (what a
gRPC ``Solve`` client that honours resets shows), and ``final``, the text that left where nothing can
be taken back (an OpenAI stream): a chunk marked final commits the text since the last reset up to its
end, provided it extends what was committed (a replay's own answer after a failure repeats it)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from coinfer import types as t


@dataclass(kw_only=True)
class AnswerView:
    text: str = ""
    """The answer streamed since the last reset."""
    final: str = ""
    """The committed text: never withdrawn, every answer of the request begins with it."""
    first_chunk_at: float | None = None
    """``time.perf_counter()`` of the first answer chunk (the time to first content)."""
    commits: list[int] = field(default_factory=list)
    """The length of ``final`` after each answer event seen (a chunk or a reset), in order: a reader that takes
    the same events after the view did (the HTTP stream) sends what each one committed, as it committed it."""

    @property
    def streamed(self) -> bool:
        """Some answer text stands streamed (a reset withdraws it)."""
        return bool(self.text)

    def see(self, ev: object) -> str:
        """Take an event in; returns the text it commits ("" for none, or for an event that is no
        answer text)."""
        new = ""
        if isinstance(ev, t.AnswerChunk):
            if self.first_chunk_at is None:
                self.first_chunk_at = time.perf_counter()
            new = self._chunk(ev)
        elif isinstance(ev, t.AnswerReset):
            self.text = ""
        else:
            return ""
        self.commits.append(len(self.final))
        return new

    def _chunk(self, ev: t.AnswerChunk) -> str:
        self.text += ev.text
        # text that does not extend what was committed (a replay's own answer) waits for the answer
        if not ev.final or len(self.text) <= len(self.final) or not self.text.startswith(self.final):
            return ""
        new, self.final = self.text[len(self.final) :], self.text
        return new

    def begins(self, answer: str) -> bool:
        """Whether ``answer`` begins with the committed text (it can be sent after it; otherwise it came from
        elsewhere and cannot be sent over it)."""
        return answer.startswith(self.final)
