"""The edge HTTP API's pure helpers (the API itself runs against real engines in tests/edge/test_daemon.py)."""

import asyncio
import contextlib
import json

import pytest

from coinfer.edge.http import failure, lone_surrogate
from coinfer.errors import CoinferError, DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable


def test_one_mapping_of_failures_to_statuses_with_no_class_names():
    assert failure(InvalidArgument("temperature: must be in [0, 2]")) == (
        400,
        "temperature: must be in [0, 2]",
        "temperature",
        "invalid_request_error",
    )
    assert failure(ResourceExhausted("prompt: 5000 chars > limit 4096"))[:3] == (
        413,
        "prompt: 5000 chars > limit 4096",
        "prompt",
    )
    assert failure(Unavailable("model: failed to load"))[::3] == (503, "server_error")
    assert failure(DeadlineExceeded("deadline"))[::3] == (504, "server_error")
    assert failure(ValueError("messages[0].role: unknown"))[2] == "messages[0].role"
    status, message, param, kind = failure(ValueError("Exceeds the limit (4300 digits) for integer string conversion"))
    assert (status, param) == (400, "request") and message.startswith("request: Exceeds")
    for bug in (SystemError("AST constructor recursion depth mismatch"), CoinferError("x"), KeyError("/etc/x")):
        status, message, param, kind = failure(bug)
        assert (status, param, kind) == (500, None, "server_error")
        assert type(bug).__name__ not in message and "/etc" not in message and message.startswith("internal error [")


def test_unpaired_surrogates_are_found_with_their_path():
    body = json.loads('{"messages": [{"role": "user", "content": "hi \\ud800"}], "x": "\\ud83d\\ude00"}')
    assert lone_surrogate(body) == "messages[0].content"
    assert lone_surrogate(json.loads('{"a": "\\ud83d\\ude00", "b": ["ok"]}')) is None
    assert lone_surrogate(json.loads('{"\\udc00": 1}')) == "body"


def _answers(monkeypatch, core, script) -> None:
    """``core`` answers every request with ``script(req)``'s events (an async generator function), each in the
    request's view of the answer before it is read, as the lifecycle's run puts it there (``Run.emit``)."""
    from coinfer.edge.shown import AnswerView

    class Scripted:
        def __init__(self, req) -> None:
            self.req, self.shown = req, AnswerView()

        async def events(self):
            async with contextlib.aclosing(script(self.req)) as events:
                async for ev in events:
                    self.shown.see(ev)
                    yield ev

    async def begin(req):
        return Scripted(req)

    monkeypatch.setattr(core, "begin", begin)


async def test_a_failure_after_the_stream_began_ends_it_with_an_error_event(monkeypatch, tmp_path):
    import httpx

    from coinfer import types as t
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.http import create_app
    from coinfer.edge.service import EdgeCore

    core = EdgeCore(EdgeConfig(model=str(tmp_path), warm=False))  # lazy: never loaded here

    async def solve(req):  # stands in for the pipeline: one draft, then a bug
        yield t.Draft(index=0, text="3+5=8", num_tokens=3)
        raise SystemError("AST constructor recursion depth mismatch")

    _answers(monkeypatch, core, solve)
    transport = httpx.ASGITransport(app=create_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://edge") as http:
        body = {"model": core.cfg.model_name, "prompt": "If x=3 and y=5, compute x+y.", "stream": True}
        r = await http.post("/v1/completions", json=body)
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert r.status_code == 200 and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and error["message"].startswith("internal error [")
        assert "SystemError" not in r.text
        r = await http.post("/v1/completions", json=body | {"stream": False})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error" and "SystemError" not in r.text


async def test_the_coinfer_block_carries_the_plans_that_ran_and_the_clouds_tokens(monkeypatch, tmp_path):
    import httpx

    from coinfer import types as t
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.http import create_app
    from coinfer.edge.result import EdgeResult
    from coinfer.edge.service import CloudTokens, Done, EdgeCore

    core = EdgeCore(EdgeConfig(model=str(tmp_path), warm=False))  # lazy: never loaded here
    result = EdgeResult(answer="x+y = 8", source="refined", valid=True, task="arith", rounds=2)

    async def solve(req):  # stands in for an escalated auto request: the edge's answer failed, a split refined it
        yield t.AnswerChunk("x+y = 8")
        yield Done(
            result=result, plan="split", plans=["edge", "split"], cloud_tokens=CloudTokens(generated=42, prompt=17)
        )

    _answers(monkeypatch, core, solve)
    monkeypatch.setattr(
        core,
        "usage",
        lambda req, done: {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "draft_tokens": 0},
    )
    transport = httpx.ASGITransport(app=create_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://edge") as http:
        body = {"model": core.cfg.model_name, "prompt": "If x=3 and y=5, compute x+y."}
        info = (await http.post("/v1/completions", json=body)).json()["coinfer"]
        assert info["plan"] == "split" and info["plans"] == ["edge", "split"]
        assert info["cloud_tokens"] == {"generated": 42, "prompt": 17}
        r = await http.post("/v1/completions", json=body | {"stream": True})
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        last = events[-1]["coinfer"]
        assert last["plans"] == ["edge", "split"] and last["cloud_tokens"] == {"generated": 42, "prompt": 17}


async def _streamed(monkeypatch, tmp_path, events: list) -> list[dict]:
    """The server-sent events (parsed) of a streamed chat completion whose core yields ``events``."""
    import httpx

    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.http import create_app
    from coinfer.edge.service import EdgeCore

    core = EdgeCore(EdgeConfig(model=str(tmp_path), warm=False))  # lazy: never loaded here

    async def solve(req):
        for ev in events:
            yield ev

    _answers(monkeypatch, core, solve)
    monkeypatch.setattr(
        core,
        "usage",
        lambda req, done: {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2, "draft_tokens": 0},
    )
    transport = httpx.ASGITransport(app=create_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://edge") as http:
        body = {
            "model": core.cfg.model_name,
            "messages": [{"role": "user", "content": "Why is the sky blue?"}],
            "stream": True,
        }
        r = await http.post("/v1/chat/completions", json=body)
    lines = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _content(events: list[dict]) -> list[str]:
    return [
        e["choices"][0]["delta"]["content"] for e in events if "content" in e.get("choices", [{}])[0].get("delta", {})
    ]


async def test_a_stream_sends_final_chunks_as_they_come_and_never_withdraws_them(monkeypatch, tmp_path):
    from coinfer import types as t
    from coinfer.edge.result import EdgeResult
    from coinfer.edge.service import CloudTokens, Done

    answer = "Rayleigh scattering: blue light scatters most."
    result = EdgeResult(answer=answer, source="cloud", valid=True, task="", finish_reason="stop")
    done = Done(result=result, plan="cloud", plans=["cloud"], cloud_tokens=CloudTokens(generated=9, prompt=7))
    events = await _streamed(
        monkeypatch,
        tmp_path,
        [
            t.AnswerChunk("Rayleigh", final=True),
            t.AnswerChunk(" scattering:", final=True),
            t.AnswerChunk(" red light", final=False),  # refused later: withdrawn before it left
            t.AnswerReset("refinement rejected"),
            t.AnswerChunk("Rayleigh scattering: blue light scatters most.", final=True),
            done,
        ],
    )
    content = _content(events)
    assert content == ["Rayleigh", " scattering:", " blue light scatters most."] and "".join(content) == answer
    # each piece left before the end: the content chunks precede the one with the finish reason and the result
    assert events[-1]["choices"][0]["finish_reason"] == "stop" and events[-1]["coinfer"]["answer"] == answer
    # nothing final: the answer whole once decided (a refinement judged whole, an older cloud)
    events = await _streamed(monkeypatch, tmp_path, [t.AnswerChunk("Rayleigh"), t.AnswerChunk(" scattering."), done])
    assert _content(events) == [answer]


async def test_a_stream_whose_sent_text_the_answer_does_not_begin_ends_in_an_error(monkeypatch, tmp_path):
    from coinfer import types as t
    from coinfer.edge.result import EdgeResult
    from coinfer.edge.service import CloudTokens, Done

    local = EdgeResult(
        answer="Because of the sea.",
        source="edge_only",
        valid=True,
        task="",
        fallback_reason="UNAVAILABLE: replica gone",
    )
    events = await _streamed(
        monkeypatch,
        tmp_path,
        [
            t.AnswerChunk("Rayleigh", final=True),
            t.AnswerReset("UNAVAILABLE: replica gone"),
            Done(result=local, plan="cloud", plans=["cloud"], cloud_tokens=CloudTokens()),
        ],
    )
    assert _content(events) == ["Rayleigh"]
    error = events[-1]["error"]
    assert error["type"] == "server_error" and "replica gone" in error["message"]


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
@pytest.mark.parametrize("stalled_write", [1, 3])
async def test_a_client_gone_mid_stream_closes_the_requests_events_before_the_response_ends(
    monkeypatch, tmp_path, spec, stalled_write
):
    """A client that disconnects while a write to it is under way (ASGI spec 2.3: the server says so on
    ``receive`` and Starlette cancels the write; 2.4: the write fails) left the response's generators
    suspended at a ``yield``, and the request's events with them: closed only when the garbage collector
    found them, the cloud call running until then. They are closed before the response ends: the write
    that stalls is the role chunk (nothing of the answer read yet) or a draft's progress chunk."""
    from starlette.requests import ClientDisconnect

    from coinfer import types as t
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.http import create_app
    from coinfer.edge.service import EdgeCore

    core = EdgeCore(EdgeConfig(model=str(tmp_path), warm=False))  # lazy: never loaded here
    log: list[str] = []

    async def solve(req):  # stands in for the request's run: drafts, then a cloud still answering
        try:
            for i in range(3):
                yield t.Draft(index=i, text="3+5=8", num_tokens=3)
            await asyncio.Event().wait()
        finally:
            log.append("events closed")

    _answers(monkeypatch, core, solve)
    body = json.dumps(
        {"model": core.cfg.model_name, "messages": [{"role": "user", "content": "x+y?"}], "stream": True}
    ).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("edge", 80),
    }
    gone, writes, received = asyncio.Event(), [], []

    async def receive() -> dict:
        if not received:
            received.append(body)
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict) -> None:
        if msg["type"] == "http.response.body" and msg.get("body"):
            writes.append(msg["body"])
            if len(writes) == stalled_write:  # the client leaves while this write is under way
                gone.set()
                if spec == "2.4":
                    raise OSError("connection reset by peer")
                await asyncio.Event().wait()  # its socket never drains: the write ends only when cancelled

    with contextlib.suppress(ClientDisconnect):  # 2.4: Starlette's word for the failed write, to the server
        await create_app(core)(scope, receive, send)
    log.append("response ended")
    assert log == ["events closed", "response ended"] and len(writes) == stalled_write
