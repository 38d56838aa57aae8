"""Helpers the tests share about event streams."""

from __future__ import annotations

from coinfer import types as t


def shown(events: list) -> str:
    """What a client that shows chunks as they come ends on: the text after the last AnswerReset."""
    text = ""
    for ev in events:
        if isinstance(ev, t.AnswerReset):
            text = ""
        elif isinstance(ev, t.AnswerChunk):
            text += ev.text
    return text
