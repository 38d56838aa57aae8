"""The remote engine's HTTP layer (``coinfer.cloud.remote_http``) on scripted answers (httpx's MockTransport):
what each failure becomes, the stream's events, the load read from vLLM's metrics, the key as a bearer token.
The same against a real vLLM server is in tests/cloud/test_remote_engine.py."""

from __future__ import annotations

import json

import httpx
import pytest

from coinfer.cloud import remote_http
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.remote_http import KeyRefused, ServerGone, ServerLoad, refused, server_load
from coinfer.errors import InvalidArgument, Unavailable

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="target"} 3.0
vllm:num_requests_running{engine="1",model_name="target"} 2.0
vllm:num_requests_waiting{engine="0",model_name="target"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="target"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="target"} 0.5
vllm:request_success_total{engine="0",finished_reason="stop",model_name="target"} 12.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="target"} 4.0
"""


def test_the_load_is_summed_over_the_servers_engines_and_the_cache_is_the_fullest():
    assert server_load(METRICS) == ServerLoad(running=5, waiting=7, kv_cache_usage=0.5)
    assert server_load("") == ServerLoad()  # a server without the gauges: nothing known, nothing claimed
    assert server_load("vllm:gpu_cache_usage_perc 0.75\n").kv_cache_usage == 0.75  # the name before v1


@pytest.mark.parametrize(
    "status, kind, said",
    [
        (400, InvalidArgument, "refused the request (400): bad"),  # the request's own fault
        (401, KeyRefused, "API key"),  # the replica's: every request would fail alike
        (404, ServerGone, "does not serve the target"),  # another model behind the URL now
        (500, Unavailable, "failed the request (500): bad"),
        (503, Unavailable, "(503)"),
    ],
)
def test_each_refusal_is_the_error_the_cloud_acts_on(status, kind, said):
    exc = refused(status, json.dumps({"error": {"message": "bad", "type": "X", "code": status}}).encode())
    assert type(exc) is kind and said in str(exc)


def _client(handler, **cfg) -> httpx.AsyncClient:
    return remote_http.client(EngineConfig(model="m", url="http://vllm:8000", **cfg), httpx.MockTransport(handler))


async def test_a_stream_yields_its_events_until_done_and_an_error_event_fails_it():
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        events = [{"choices": [{"index": 0, "text": "a", "token_ids": [5]}]}, {"choices": [], "usage": {}}]
        if body.get("fail"):  # vLLM's way to fail a stream that began: an error event
            events.append({"error": {"message": "engine died", "code": 500}})
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + ": keep-alive\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    async with _client(handler) as http:
        got = [e async for e in remote_http.stream(http, "/v1/completions", {})]
        assert got[0]["choices"][0]["token_ids"] == [5] and len(got) == 2
        with pytest.raises(Unavailable, match="engine died"):
            [e async for e in remote_http.stream(http, "/v1/completions", {"fail": True})]


async def test_a_connection_that_fails_is_server_gone_and_the_key_goes_as_a_bearer_token(tmp_path):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        raise httpx.ConnectError("All connection attempts failed")

    key = tmp_path / "key"
    key.write_text("s3cret-key-0123456789\n")
    async with _client(handler, key_file=str(key)) as http:
        with pytest.raises(ServerGone, match="unreachable") as e:
            await remote_http.post(http, "/v1/completions", {})
    assert seen == ["Bearer s3cret-key-0123456789"] and "s3cret" not in str(e.value)


def test_the_key_is_never_in_the_configs_repr():
    cfg = EngineConfig(model="m", url="http://vllm:8000", api_key="s3cret-key-0123456789")
    assert "s3cret" not in repr(cfg) and "s3cret" not in str(cfg)
