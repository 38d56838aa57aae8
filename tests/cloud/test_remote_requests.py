"""What the remote engine (``coinfer.cloud.remote_engine``) asks a vLLM server, on a scripted one (httpx's
MockTransport; the demo target's tokenizer): token ids, every sampling field given, each session's requests
under one session key and two sessions' under two. The same engine against a real vLLM server is in
tests/cloud/test_remote_engine.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from coinfer.chat import ChatMessage
from coinfer.cloud import remote_http
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.engine import GenParams, metered
from coinfer.cloud.remote_engine import SESSION_HEADER, RemoteEngine
from coinfer.cloud.remote_http import KeyRefused
from coinfer.errors import Unavailable

TARGET = Path(__file__).resolve().parents[2] / "demo/weights/target"
KEY = "s3cret-key-0123456789"


class Scripted:
    """A vLLM server that lists the target, tokenizes as it does, and answers "ok" one token at a time."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.key = KEY
        self.asked: list[tuple[dict, str | None]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/health", "/metrics"):  # open, as vLLM's: no key asked
            return httpx.Response(200, text="")
        if request.headers.get("authorization") != f"Bearer {self.key}":
            return httpx.Response(401, json={"error": {"message": "Unauthorized", "code": 401}})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "target", "max_model_len": 1024}]})
        body = json.loads(request.content)
        if isinstance(body["prompt"], str):  # the identity probe: tokenized as the target does
            ids = self.tok(body["prompt"])["input_ids"]
            return httpx.Response(200, json={"choices": [{"index": 0, "text": "", "prompt_token_ids": ids}]})
        self.asked.append((body, request.headers.get(SESSION_HEADER)))
        events = [{"choices": [{"index": 0, "text": t, "token_ids": [9]}]} for t in ("o", "k")]
        events += [{"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "stop"}]}]
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


async def _engine(server: Scripted, monkeypatch, **cfg) -> RemoteEngine:
    real_client = remote_http.client
    monkeypatch.setattr(remote_http, "client", lambda cfg: real_client(cfg, httpx.MockTransport(server.handle)))
    return await RemoteEngine(EngineConfig(model=str(TARGET), url="http://vllm:8000", api_key=KEY, **cfg)).start(
        wait_s=5
    )


def _server() -> Scripted:
    from transformers import AutoTokenizer

    return Scripted(AutoTokenizer.from_pretrained(TARGET))


async def test_each_sessions_requests_go_under_its_own_key_with_every_sampling_field_given(monkeypatch):
    server = _server()
    engine = await _engine(server, monkeypatch)
    try:
        prompt = engine.render([ChatMessage("user", "If x=3 and y=5, compute (x+y)^2-x*y.")])

        async def session() -> str:
            metered()  # a session begins: its own cost counter
            texts = []
            for _ in range(2):
                texts.append("".join([c.text async for c in engine.generate(prompt, GenParams(max_tokens=8), "r")]))
            return "".join(texts)

        assert await asyncio.gather(session(), session()) == ["okok", "okok"]
    finally:
        await engine.close()
    keys = [key for _, key in server.asked]
    assert len(server.asked) == 4 and len(set(keys)) == 2 and all(keys.count(k) == 2 for k in keys)
    body = server.asked[0][0]
    assert body["prompt"] == await engine.prompt_ids(prompt) and body["stream"] and body["return_token_ids"]
    # the server's defaults (its model's generation config) never fill a field in
    for field in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "stop_token_ids"):
        assert field in body, field
    assert body["stop_token_ids"] == sorted(engine.stop_ids) and body["stream_options"] == {"include_usage": True}
    assert "stream_interval" not in body  # 1: the server's own default, not asked


async def test_a_generation_streams_the_configured_tokens_an_event_and_whole_samples_one_event_each(monkeypatch):
    server = _server()
    engine = await _engine(server, monkeypatch, stream_interval=4)
    try:
        prompt = engine.render([ChatMessage("user", "Say ok.")])
        assert "".join([c.text async for c in engine.generate(prompt, GenParams(max_tokens=8), "r")]) == "ok"
        assert [c.text async for c in engine.finished_samples(prompt, GenParams(max_tokens=8), 2, "s")] == ["ok"]
    finally:
        await engine.close()
    (generated, _), (sampled, _) = server.asked
    # vLLM's per-request stream_interval: the first token at once, then every 4 (a whole sample: its end)
    assert generated["stream_interval"] == 4 and sampled["stream_interval"] == 8 and sampled["n"] == 2


async def test_a_key_the_server_refuses_turns_the_engine_down_until_the_server_takes_it_again(monkeypatch):
    # vLLM's /health asks for no key: the probe alone would find the server up while every request fails
    server = _server()
    engine = await _engine(server, monkeypatch)
    try:
        prompt = engine.render([ChatMessage("user", "hi")])
        server.key = "rotated-on-the-server-0123"
        with pytest.raises(KeyRefused, match="API key"):
            [c async for c in engine.generate(prompt, GenParams(max_tokens=4), "r")]
        with pytest.raises(Unavailable, match="API key"):
            await engine.check_health()  # down at once: new sessions refused, health NOT_SERVING
        await engine.watch.probe()  # /health answers, the model list refuses the key: still down
        assert not engine.stats().ready
        server.key = KEY
        await engine.watch.probe()
        await engine.check_health()  # checked as at start: up
    finally:
        await engine.close()
