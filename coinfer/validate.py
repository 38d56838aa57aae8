"""The checks every request gets, on the edge and the cloud alike: one place, so that both sides refuse
the same input with the same message (only the field path differs: the edge's ``prompt`` is the
cloud's ``problem.prompt``)."""

from __future__ import annotations

from collections.abc import Sequence

from coinfer.chat import ChatMessage, validate_messages
from coinfer.errors import InvalidArgument, ResourceExhausted, require

MAX_REQUEST_ID = 128
MAX_DRAFT_MODEL = 128
"""The longest draft model identity an edge may send: a digest ("sha256:" and 64 hex digits) and room."""
MAX_DEADLINE_MS = 600_000
"""The longest deadline a request may ask for (10 minutes): past it a client has gone."""
MAX_NEW_TOKENS = 4096
"""The largest token budget a request may ask for (an OpenAI ``max_tokens``, a refinement's budget):
the context of the small models served here; a server clamps it further to its own budget."""


def check_question(prompt: str, messages: Sequence[ChatMessage], max_chars: int, where: str = "") -> str:
    """A prompt or a conversation, not both, within ``max_chars`` characters (RESOURCE_EXHAUSTED past
    it: a limit, not a malformed request). ``where``: the fields' parent path ("problem."). Returns the
    field that carried the question, for the messages of later checks."""
    if messages:
        require(prompt == "", f"{where}prompt", "give prompt or messages, not both")
        validate_messages(messages, f"{where}messages")
        size, field = sum(len(m.content) for m in messages), f"{where}messages"
    else:
        require(isinstance(prompt, str) and prompt.strip() != "", f"{where}prompt", "required (or messages)")
        size, field = len(prompt), f"{where}prompt"
    if size > max_chars:
        raise ResourceExhausted(f"{field}: {size} chars > limit {max_chars}")
    return field


def check_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID:
        raise InvalidArgument(f"request_id: {len(request_id)} chars > {MAX_REQUEST_ID}")


def check_deadline(deadline_ms: int, max_ms: int = MAX_DEADLINE_MS) -> None:
    """0 = the server's default; otherwise at most ``max_ms``."""
    if not 0 <= deadline_ms <= max_ms:
        raise InvalidArgument(f"deadline_ms: must be in 0..{max_ms}, got {deadline_ms}")


def check_draft_model(draft_model: str) -> None:
    """The edge's draft model identity: a key of the cloud's round odds, so bounded in length."""
    if len(draft_model) > MAX_DRAFT_MODEL:
        raise InvalidArgument(f"draft_model: {len(draft_model)} chars > {MAX_DRAFT_MODEL}")
