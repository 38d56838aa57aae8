"""One chat request through the official ``openai`` SDK against the edge daemon, plain or streamed,
timed as the user sees it: what the demos and benchmarks that speak the OpenAI API share."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Asked:
    ms: float
    """Wall time of the whole request."""
    ttft_ms: float
    """Time to the first content token (streamed; 0 when not streamed or no content)."""
    info: dict
    """The response's ``coinfer`` block (the last chunk's, streamed)."""
    content: str
    finish: str | None


async def ask(
    client,
    messages: list[dict],
    coinfer: dict,
    stream: bool = False,
    max_tokens: int | None = None,
    model: str = "coinfer-edge",
) -> Asked:
    """``messages`` with ``coinfer`` as the request's ``coinfer`` extension (plan, rules, ...)."""
    kw: dict = {"model": model, "messages": messages, "extra_body": {"coinfer": coinfer}}
    if max_tokens is not None:
        kw["max_tokens"] = max_tokens
    t0 = time.perf_counter()
    if not stream:
        r = await client.chat.completions.create(**kw)
        return Asked(
            (time.perf_counter() - t0) * 1e3,
            0.0,
            r.model_extra["coinfer"],
            r.choices[0].message.content,
            r.choices[0].finish_reason,
        )
    text, info, finish, ttft = "", {}, None, 0.0
    async for c in await client.chat.completions.create(stream=True, **kw):
        if c.choices:
            delta = c.choices[0].delta.content
            if delta:  # text leaves once final: at once in the cloud plan, else when decided (docs/api.md, Streaming)
                ttft = ttft or (time.perf_counter() - t0) * 1e3
                text += delta
            finish = c.choices[0].finish_reason or finish
        info = (c.model_extra or {}).get("coinfer") or info
    return Asked((time.perf_counter() - t0) * 1e3, ttft, info, text, finish)
