"""The OpenAI-compatible API's request bodies (``edge/http.py`` serves them): the fields it takes, their ranges,
and what it refuses with a 400 naming the field rather than ignore -- what it does not serve (``NOT_SERVED``)
and coinfer's own options sent beside OpenAI's (``COINFER_OPTIONS``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from coinfer import types as t
from coinfer.chat import ChatMessage
from coinfer.edge.kinds import RequestedPlan
from coinfer.extract import KINDS
from coinfer.validate import MAX_NEW_TOKENS


class ExtractionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal[KINDS]
    pattern: str = Field(default="", max_length=512)
    marker: str = Field(default="", max_length=64)


class CoinferExtra(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str = ""
    # a bare name for the kinds that need no parameter; {"kind": "regex", "pattern": ...} for a regex
    extraction: Literal[tuple(k for k in KINDS if k != "regex")] | ExtractionBody | None = None
    rules: list[dict[str, Any]] = Field(default_factory=list)
    plan: RequestedPlan = RequestedPlan.AUTO
    # upper bounds are the daemon's (EdgeConfig.max_drafts, coinfer.validate.MAX_DEADLINE_MS): checked once,
    # by the core that serves gRPC too
    num_drafts: int = Field(default=0, ge=0)
    deadline_ms: int = Field(default=0, ge=0)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI's newer options (include_obfuscation) change nothing here
    include_usage: bool = False
    """One more chunk before ``[DONE]``: ``choices`` empty, ``usage`` the request's; every other chunk's ``usage``
    null (OpenAI's contract, vLLM's too)."""


COINFER_OPTIONS = tuple(CoinferExtra.model_fields)
"""coinfer's own request options: they go in the ``coinfer`` object, and one sent at the top is a 400 naming it."""

NOT_SERVED = ("logprobs", "top_logprobs", "tools", "functions", "logit_bias", "echo", "suffix")
"""OpenAI fields that ask for something this API does not serve (token logprobs, tool calls, a biased
vocabulary, the prompt echoed). Sent empty or off they are accepted; asking for it is a 400 naming the field --
ignored, a client would read a response without what it asked for as if it had it."""


class RequestBody(BaseModel):
    """What ``/v1/completions`` and ``/v1/chat/completions`` share."""

    model_config = ConfigDict(extra="allow")  # OpenAI fields that change nothing here (user, metadata, ...)
    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    """OpenAI's newer name for ``max_tokens`` (what its SDK sends for newer models); it wins where both are sent,
    as in vLLM."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    coinfer: CoinferExtra = Field(default_factory=CoinferExtra)
    logprobs: bool | int | None = None  # NOT_SERVED: chat's is a bool, completions' an int
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    logit_bias: dict[str, Any] | None = None
    echo: bool | None = None
    suffix: str | None = None
    tool_choice: str | dict[str, Any] | None = None
    best_of: int | None = None
    response_format: dict[str, Any] | None = None
    # coinfer's own options sent beside OpenAI's (``COINFER_OPTIONS``): extra fields are accepted and change
    # nothing, so {"plan": "split"} at the top ran the planner's choice and said nothing (tried by hand)
    task: Any = None
    extraction: Any = None
    rules: Any = None
    plan: Any = None
    num_drafts: Any = None
    deadline_ms: Any = None

    @field_validator(*COINFER_OPTIONS)
    @classmethod
    def _in_the_coinfer_object(cls, v: object, info: ValidationInfo) -> object:
        if v is not None:
            raise ValueError(
                f'coinfer\'s own option: send it in the coinfer object ({{"coinfer": {{"{info.field_name}": ...}}}})'
            )
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if not t.stops_ok([v] if isinstance(v, str) else v or []):  # here, to name the field the client sent
            raise ValueError(t.STOPS_RULE)
        return v

    @field_validator(*NOT_SERVED)
    @classmethod
    def _not_served(cls, v: object) -> object:
        if v:  # 0, False, "", [] and {} ask for nothing
            raise ValueError("not served by coinfer (leave it unset)")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_call(cls, v: object) -> object:
        if v not in (None, "none", "auto"):
            raise ValueError("not served by coinfer: no tool calls (none or auto, or leave it unset)")
        return v

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError("not served by coinfer: one completion (1, or leave it unset)")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_format(cls, v: dict | None) -> dict | None:
        if v is not None and v.get("type", "text") != "text":
            raise ValueError(
                'not served by coinfer: text only ({"type": "text"}); for a JSON answer, '
                'coinfer.extraction "json" and rules check it'
            )
        return v

    @field_validator("stream_options")
    @classmethod
    def _options_with_stream(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream"):  # OpenAI's rule: an option of a stream
            raise ValueError("only with stream: true")
        return v


class CompletionBody(RequestBody):
    prompt: str = Field(min_length=1)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessageBody(BaseModel):
    # "developer" is OpenAI's newer name for the system role
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[TextPart]

    def domain(self) -> ChatMessage:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return ChatMessage("system" if self.role == "developer" else self.role, text)


class ChatBody(RequestBody):
    messages: list[ChatMessageBody] = Field(min_length=1, max_length=64)
