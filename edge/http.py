"""OpenAI-compatible HTTP API of the edge daemon (FastAPI): existing OpenAI SDK clients work unchanged.

``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream: true``
-> server-sent events ending in ``data: [DONE]``), ``GET /healthz``, ``GET /metrics``.
Any prompt or conversation: ``/v1/chat/completions`` keeps the system message and history
(each side renders them with its own model's chat template); ``/v1/completions`` sends its
prompt as one user turn. coinfer's own knobs ride in an extra ``coinfer`` object
(``extra_body={"coinfer": {...}}`` in the SDK): ``task`` (a built-in preset; default: inferred
from the prompt, else an open request), ``extraction`` (``"marker"`` or ``{"kind": "regex",
"pattern": ...}``: none | marker | boxed | last_line | json | regex), ``rules``, ``plan``,
``num_drafts``, ``deadline_ms``. Standard fields -- ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p``,
``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop`` -- reach the drafts and the
cloud's refinement; unset ones keep the daemon's draft defaults (docs/design.md §4.2: T=0.3, top_p 0.95,
...) and the cloud's refinement defaults (greedy). ``usage`` counts the draft model's tokenizer
tokens of the prompt and the answer; a stream sends it last when ``stream_options.include_usage`` asks.
What it does not serve (``NOT_SERVED``: logprobs, tools, logit_bias, echo, ...; ``response_format`` other than
text, ``best_of`` over 1) is a 400 naming the field when asked for, accepted when sent empty or off; so is one of
coinfer's own options sent at the top instead of in ``coinfer`` (``COINFER_OPTIONS``).

Streaming sends answer text the moment it is final and never takes it back (an OpenAI stream cannot):
the cloud marks each chunk final when every answer it can still end on begins with the text so far
(``AnswerChunk.final``): a draft accepted as is, the part of a continuation or prefix refinement that
says what its fallback draft says, and the cloud's own answer to an open request with no rules and
nothing to extract (only the loop watch judges it; a loop is cut, ``finish_reason: "repetition"``,
not replaced). Text a check of the whole answer may still refuse (a refinement, a preset's or a
ruled request's answer) is held until the answer is decided, then sent; a local (edge) answer
arrives whole. After an ``AnswerReset`` the text already sent is not sent again. A local fallback
after final text left continues that text (``edge/shown.py``); only a replay that answers differently
after final text left ends the stream with an error event (docs/api.md, Streaming).

Progress chunks carry an empty delta and a ``coinfer`` object (each draft and each verdict as it
happens). The last chunk's ``coinfer`` holds the result (answer, source, validity, extracted ``fields``,
timings), as does a whole answer's ``coinfer`` object: among them ``plan`` (the
plan that produced the answer), ``plans`` (every plan that ran, in order: ``["edge", "split"]`` when
auto's edge answer failed the rules and was escalated) and ``cloud_tokens`` (``{"generated": N,
"prompt": M}``, the cloud's target-model tokens for the request; zeros when it was not used).
Errors: 400 with an OpenAI-style error body naming the field (``param``), 413 over a limit, 408 for a
body that does not arrive within ``http_body_timeout_s`` (a slow head is closed by ``edge/http_guard.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from coinfer import types as t
from coinfer.chat import ChatMessage
from coinfer.edge.http_body import (
    ChatBody,
    CompletionBody,
    RequestBody,
)
from coinfer.edge.service import Done, EdgeCore, SolveRequest
from coinfer.edge.shown import AnswerView
from coinfer.errors import CoinferError, DeadlineExceeded, ResourceExhausted, Unavailable, field_of, internal_error
from coinfer.extract import Extraction
from coinfer.rules import Rule
from coinfer.validate import MAX_NEW_TOKENS

MAX_BODY_BYTES = 1 << 20


def _error(status: int, message: str, param: str | None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def _given(body: RequestBody) -> dict:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    given = {
        "max_new_tokens": body.max_completion_tokens or body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "seed": body.seed,
        "stop": stop or None,
    }
    return {k: v for k, v in given.items() if v is not None}


def draft_sampling(given: dict) -> t.SamplingParams | None:
    """Draft sampling for a request's standard fields ``given`` (``SamplingParams`` names): those fields, the
    daemon's draft defaults (docs/design.md §4.2) for the rest; None where nothing is given."""
    return t.SamplingParams(**given) if given else None


def refine_sampling(given: dict) -> t.SamplingParams | None:
    """The refinement's sampling for a request's standard fields ``given`` (``SamplingParams`` names): those
    fields, no penalties and greedy for the rest (the draft defaults are for exploring; the final answer
    should not be penalised for repeating a draft's words). Unset, the budget is the largest a request may
    ask for: the cloud clamps it to its own (its policy's refinement budget), which is the answer budget
    that applies. None where nothing is given (the cloud's defaults)."""
    if not given:
        return None
    greedy = {"temperature": 0.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    return t.SamplingParams(**(greedy | {"max_new_tokens": MAX_NEW_TOKENS} | given))


def _request(body: RequestBody, prompt: str, messages: list[ChatMessage]) -> SolveRequest:
    x, given = body.coinfer, _given(body)
    rules = []
    for i, r in enumerate(x.rules):
        if not isinstance(r.get("kind"), str):
            raise ValueError(f"coinfer.rules[{i}].kind: required string")
        rules.append(Rule(r["kind"], r.get("params") or {}, r.get("name", "")))
    e = x.extraction
    extraction = (
        Extraction() if e is None else Extraction(e) if isinstance(e, str) else Extraction(e.kind, e.pattern, e.marker)
    )
    return SolveRequest(
        prompt=prompt,
        task=x.task,
        rules=rules,
        sampling=draft_sampling(given),
        num_drafts=x.num_drafts,
        plan=x.plan,
        deadline_ms=x.deadline_ms,
        request_id=uuid.uuid4().hex[:16],
        messages=messages,
        extraction=extraction,
        refine=refine_sampling(given),
    )


def _draft_info(d: t.Draft) -> dict:
    return {
        "index": d.index,
        "text": d.text,
        "num_tokens": d.num_tokens,
        "mean_logprob": round(d.mean_logprob, 4),
        "edge_ms": round(d.edge_ms, 1),
        "truncated": d.truncated,
        "greedy": d.greedy,
        "continues": d.continues,
    }


def _verdict_info(v: t.Verdict) -> dict:
    return {
        "draft_index": v.draft_index,
        "valid": v.valid,
        "score": round(v.score, 4),
        "error": v.error,
        "failed_rule": v.failed_rule,
        "duplicate_of": v.duplicate_of,
        "repaired": v.repaired,
    }


def _info(done: Done) -> dict:
    r = done.result
    return done.info() | {
        "drafts": [_draft_info(d) for d in r.drafts],
        "verdicts": [_verdict_info(v) for _, v in sorted(r.verdicts.items())],
        # the cloud's account of its choice: each draft's verdict, then how it answered
        "trace": r.summary.trace if r.summary is not None else "",
    }


async def _read_body(request: Request, timeout_s: float) -> bytes | JSONResponse:
    """The body, read as it streams in: over the limit stops at the limit (not after buffering
    what a client chose to send), and a body that trickles past ``timeout_s`` gets 408."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return _error(413, f"body: {declared} bytes > limit {MAX_BODY_BYTES}", "body")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    return _error(413, f"body: over {MAX_BODY_BYTES} bytes", "body")
                chunks.append(chunk)
    except TimeoutError:
        return _error(408, f"body: not received within {timeout_s:g} s", "body")
    return b"".join(chunks)


_FIELD = re.compile(r"[A-Za-z_][\w.\[\]]{0,80}")


def failure(exc: BaseException) -> tuple[int, str, str | None, str]:
    """(HTTP status, message, param, OpenAI error type) of a failed request: the one mapping, for an
    answer before the stream starts and for the error event that ends a stream already begun."""
    if isinstance(exc, ResourceExhausted):
        return 413, exc.message, exc.field, "invalid_request_error"
    if isinstance(exc, (Unavailable, DeadlineExceeded)):  # the server's state, or a deadline: not bad input
        return (503 if isinstance(exc, Unavailable) else 504), exc.message, None, "server_error"
    if isinstance(exc, CoinferError) and type(exc) is not CoinferError:
        return 400, exc.message, exc.field, "invalid_request_error"
    if isinstance(exc, (ValueError, RecursionError)) and not isinstance(exc, UnicodeError):
        msg = str(exc) or "not valid"  # a parser's refusal: "<field>: ..." where it names one
        return (
            (400, msg, field_of(msg), "invalid_request_error")
            if _FIELD.fullmatch(field_of(msg))
            else (400, f"request: {msg}", "request", "invalid_request_error")
        )
    return 500, internal_error(exc), None, "server_error"


def lone_surrogate(obj: object) -> str | None:
    """The path (``messages[0].content``) of the first string or key in parsed JSON holding an unpaired
    surrogate (``"\\ud800"``), or None. Iterative: the parser already bounded the depth."""
    stack: list[tuple[object, str]] = [(obj, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return path or "body"
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, path or "body"))
                stack.append((v, f"{path}.{k}" if path else str(k)))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return None


async def _parse(core: EdgeCore, request: Request, cls: type[RequestBody]) -> RequestBody | JSONResponse:
    """The request body as ``cls``, or the 4xx response naming the field."""
    raw = await _read_body(request, core.cfg.http_body_timeout_s)
    if isinstance(raw, JSONResponse):
        return raw

    def load() -> RequestBody | JSONResponse:
        obj = json.loads(raw)
        if (where := lone_surrogate(obj)) is not None:  # JSON may escape half a UTF-16 pair; UTF-8 cannot hold it
            return _error(400, f"{where}: invalid Unicode (an unpaired surrogate escape)", where)
        return cls.model_validate(obj)

    try:  # a 1 MiB body takes milliseconds to parse and validate: in a worker thread, not on the loop
        body = await asyncio.to_thread(load)
        if isinstance(body, JSONResponse):
            return body
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"body: not valid JSON ({exc})", "body")
    except RecursionError:
        return _error(400, "body: JSON nested too deeply", "body")
    except ValidationError as exc:
        err = exc.errors()[0]
        # a union's member tags ("literal['none', ...]") are pydantic's, not a field
        param = ".".join(str(p) for p in err["loc"] if isinstance(p, int) or str(p).isidentifier()) or "body"
        core.metrics.bad_request(param)
        return _error(400, f"{param}: {err['msg']}", param)
    except ValueError:  # int() past its 4,300 digits: a number no field takes
        return _error(400, "body: not valid JSON (a number too long)", "body")
    if body.model != core.cfg.model_name:
        return _error(404, f"model: unknown {body.model!r} (served: {core.cfg.model_name})", "model")
    return body


async def _respond(
    core: EdgeCore, body: RequestBody, prompt: str, chat: bool, messages: list[ChatMessage] | None = None
) -> Response:
    """Solve the request: the whole answer as JSON, or a stream of server-sent events. Validation runs
    before the first event, so bad input is still a 4xx here, never an error inside a 200 stream."""
    try:
        req = _request(body, prompt, messages or [])
        lifecycle = await core.begin(req)
        events = lifecycle.events()
        first = await anext(events)
    except Exception as exc:  # noqa: BLE001 - every failure gets its status, a bug too (500, no details)
        status, message, param, kind = failure(exc)
        if kind == "invalid_request_error":
            core.metrics.bad_request(param or "request")
        return _error(status, message, param, kind)
    completion = _Completion(core, body, req, chat, first, events, lifecycle.shown)
    return await completion.whole() if not body.stream else _EventStream(completion)


class _EventStream(StreamingResponse):
    """A request's server-sent events. A client gone mid-stream ends the response inside a write (Starlette
    cancels it, or it fails), with the generators suspended at a ``yield``: nothing resumes them, and
    ``async for`` closes none. They are closed here before the response ends, the request's events with
    them (``RequestLifecycle.events``: its run and cloud call are cancelled), not when the garbage collector
    finds them."""

    def __init__(self, completion: _Completion) -> None:
        super().__init__(completion.sse(), media_type="text/event-stream")
        self.completion = completion

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the request's events as well: a stream cut before sse() began its loop holds them unread
        async with contextlib.aclosing(self.completion.events), contextlib.aclosing(self.body_iterator):
            await super().__call__(scope, receive, send)


class _Completion:
    """One OpenAI-style response to a validated request: its id, object names and events, and ``shown``: what the
    user has seen of the answer (the request's lifecycle owns it; a stream sends its final text)."""

    def __init__(
        self,
        core: EdgeCore,
        body: RequestBody,
        req: SolveRequest,
        chat: bool,
        first: object,
        events: AsyncIterator[object],
        shown: AnswerView,
    ) -> None:
        self.core, self.body, self.req, self.chat = core, body, req, chat
        self.first, self.events, self.shown = first, events, shown
        self.sent = 0
        """Characters of ``shown.final`` that left over HTTP."""
        self.answer_events = 0
        """Answer events (chunks, resets) read: ``shown.commits`` says what final text each committed."""
        self.rid, self.created = f"{'chatcmpl' if chat else 'cmpl'}-{req.request_id}", int(time.time())

    async def whole(self) -> JSONResponse:
        try:
            done = self.first
            async with contextlib.aclosing(self.events) as events:
                async for ev in events:
                    done = ev  # the last event is the request's Done
            if not isinstance(done, Done):
                raise RuntimeError("the request's events ended without its result")
        except Exception as exc:  # noqa: BLE001 - after validation: the server's (or the cloud's) failure
            status, message, param, kind = failure(exc)
            return _error(status, message, param, kind)
        text = done.result.answer
        finish = done.result.finish_reason  # "length": the answer hit its token budget (incomplete)
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if self.chat
            else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        )
        return JSONResponse(
            {
                "id": self.rid,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.body.model,
                "choices": [choice],
                "usage": self.core.usage(self.req, done),
                "coinfer": _info(done) | {"answer": text},
            }
        )

    def chunk(self, delta: str | None, finish: str | None = None, extra: dict | None = None, role: bool = False) -> str:
        if self.chat:
            d = {"role": "assistant"} if role else {} if delta is None else {"content": delta}
            choice = {"index": 0, "delta": d, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        payload = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.body.model,
            "choices": [choice],
        }
        if extra:
            payload["coinfer"] = extra
        if self.usage_chunk:
            payload["usage"] = None
        return f"data: {json.dumps(payload)}\n\n"

    @property
    def usage_chunk(self) -> bool:
        """Whether the stream ends with a usage chunk (``stream_options.include_usage``)."""
        return self.body.stream_options is not None and self.body.stream_options.include_usage

    def usage(self, usage: dict) -> str:
        """The chunk ``include_usage`` asks for: no choices, the request's usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        payload = {"id": self.rid, "object": obj, "created": self.created, "model": self.body.model}
        return f"data: {json.dumps(payload | {'choices': [], 'usage': usage})}\n\n"

    async def sse(self) -> AsyncIterator[str]:
        """The request's server-sent events, as its events come (the one generator between the lifecycle's
        events and the response)."""
        if self.chat:
            yield self.chunk(None, role=True)
        try:
            for data in self._sse(self.first):
                yield data
            async for ev in self.events:  # closed by ``_EventStream`` however the response ends
                for data in self._sse(ev):
                    yield data
        except Exception as exc:  # noqa: BLE001 - the stream has begun: end it with an error event, not a cut
            _, message, param, kind = failure(exc)
            yield f"data: {json.dumps({'error': {'message': message, 'type': kind, 'param': param, 'code': None}})}\n\n"
        yield "data: [DONE]\n\n"

    def _sse(self, ev: object) -> list[str]:
        """The server-sent events for one of the request's events: its progress, the final text the answer
        committed and that has not left yet (at once, never withdrawn), or the rest of the answer and the result."""
        if isinstance(ev, t.Draft):
            return [self.chunk(None, None, {"event": "draft", "draft": _draft_info(ev)})]
        if isinstance(ev, t.Verdict):
            return [self.chunk(None, None, {"event": "verdict", "verdict": _verdict_info(ev)})]
        if isinstance(ev, (t.AnswerChunk, t.AnswerReset)):
            # a reset: a rejected refinement, or a replay after a failure; its answer follows. The view took this
            # event when the run emitted it (and may have taken later ones since): the final text as of this one
            upto = self.shown.commits[self.answer_events]
            self.answer_events += 1
            new, self.sent = self.shown.final[self.sent : upto], max(self.sent, upto)
            return [self.chunk(new)] if new else []
        if isinstance(ev, Done):
            answer = ev.result.answer
            if not self.shown.begins(answer):  # sent text cannot be withdrawn: no answer rather than a wrong one
                raise Unavailable(
                    f"answer: a cloud replica failed after {self.sent} chars of its answer "
                    f"were streamed, and its replay answered differently "
                    f"({ev.result.fallback_reason or 'a replay'}): retry the request"
                )
            rest, self.sent = answer[self.sent :], len(answer)
            usage = self.core.usage(self.req, ev)
            info = _info(ev) | {"usage": usage, "answer": answer}
            out = [*([self.chunk(rest)] if rest else []), self.chunk(None, ev.result.finish_reason, info)]
            return out + [self.usage(usage)] if self.usage_chunk else out
        return []


def create_app(core: EdgeCore) -> FastAPI:
    """The OpenAI-compatible API over ``core``: thin routes; parsing (_parse), solving (_respond) and the response (_Completion) live above."""
    app = FastAPI(title="coinfer edge", docs_url=None, redoc_url=None)

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": core.cfg.model_name, "object": "model", "created": 0, "owned_by": "coinfer"}],
        }

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(core, request, CompletionBody)
        return body if isinstance(body, JSONResponse) else await _respond(core, body, body.prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _parse(core, request, ChatBody)
        if isinstance(body, JSONResponse):
            return body
        return await _respond(core, body, "", chat=True, messages=[m.domain() for m in body.messages])

    @app.get("/healthz")
    async def healthz():
        st = core.status()
        return JSONResponse(st, status_code=200 if st["model_state"] == t.ModelState.WARM or not core.cfg.warm else 503)

    @app.get("/metrics")
    async def metrics():
        core.metrics.replicas(core.link.replicas.values())
        return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
