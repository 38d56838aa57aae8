"""The target engine on a vLLM OpenAI-compatible server elsewhere (``RemoteEngine``): the cloud's sessions in this
process, light (no model, no vLLM), the target on a server or fleet the operator already runs.

Usage::

    vllm serve MODEL_DIR --port 8000 --enable-prompt-tokens-details    # or the fleet's endpoint
    coinfer-cloud MODEL_DIR --engine.url http://127.0.0.1:8000 --port 50051

``MODEL_DIR`` is a local copy of the model the server serves: this process tokenizes every text with its
tokenizer and renders conversations with its chat template (``coinfer.cloud.vllm_common``), and sends token ids
to ``/v1/completions``, so that the server reads exactly what the in-process engine would be given. At start
(and whenever the server comes back) the server must list the model (``/v1/models``) and tokenize a probe text
as this tokenizer does, or it is refused (``WrongServer``). Per method:

- ``generate_ids``, ``finished_samples``: streamed completions (``return_token_ids``: the tokens of each delta;
  ``stream_interval``: ``EngineConfig.stream_interval`` tokens an event, a whole completion for ``finished_samples``);
  ``sample``, ``judge`` (``structured_outputs``): one answer;
- ``top_tokens``: ``prompt_logprobs`` 2 and ``logprobs`` 2 on one greedy token, not streamed (vLLM streams no
  prompt logprobs past 0). vLLM's OpenAI server never reads the prefix cache for a request with prompt logprobs
  (``SamplingParams.skip_reading_prefix_cache`` defaults to it, and its protocol has no field to say otherwise),
  so every check prefills its whole text: correct, with more prefill than in process (which reads the cache and
  asks again where the cache covered a row it needs). Nor are rows left unwritten by the cache ever detokenized
  by the server (the in-process engine's crash with detokenizing on);
- ``continuation_logprobs``: ``prompt_logprobs`` 0 (each prompt token's own logprob);
- cancellation: a caller that stops reading closes the response, and so its connection, on which vLLM's server
  aborts the request (``abort`` has nothing left to do);
- the cost (``Summary.cost``): counted as ``VllmEngine._run`` counts it, the prefix-cache hits from the usage
  block's ``prompt_tokens_details``, which vLLM fills only with ``--enable-prompt-tokens-details`` (0 without).

The server's health is ``coinfer.cloud.remote_health.ServerWatch``'s: a server down, restarting or failing turns
this replica NOT_SERVING (new sessions UNAVAILABLE: the edge replays elsewhere or answers locally), one that is
back SERVING; the engine ``recovers`` by itself, it is never replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from coinfer.cloud import remote_http
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.engine import Chunk, EngineStats, GenParams, current_cost
from coinfer.cloud.remote_health import ServerWatch
from coinfer.cloud.remote_http import KeyRefused, ServerLoad, WrongServer
from coinfer.cloud.sampled import Row
from coinfer.cloud.vllm_common import REFUSED_BIAS, TokenizingEngine, sampled_row, tie_nats, top2, vllm_temperature
from coinfer.errors import Unavailable
from coinfer.types import RequestTally

log = logging.getLogger(__name__)

COMPLETIONS = "/v1/completions"
SESSION_HEADER = "x-coinfer-session"
"""Sent with every request of one session, the same value for all of them: a router in front of a fleet that
routes by it (vLLM production-stack's ``routerSpec.sessionKey``) sends a session's requests to one server, whose
prefix cache then holds its prompt for the next (scoring, the exact checks and the answer share it)."""
PROBE_TEXT = "coinfer probe: 12+34=46; naïve café, 東京 🙂\n\tdef f(x): return x**2\n\n  Done."
"""Tokenized by the server and here at start: digits, accents, CJK, an emoji, tabs and runs of spaces, where
tokenizers of different models part (and the tokenizer's eos text after it: special tokens read alike)."""
WAIT_LOG_S = 30.0
"""While the server is not reached at start, a line this often."""


class RemoteEngine(TokenizingEngine):
    """A vLLM OpenAI-compatible server at ``cfg.url``. Create inside a running event loop via ``start``."""

    speculative = True
    recovers = True

    def __init__(self, cfg: EngineConfig) -> None:
        cfg.validate()
        if not cfg.remote:
            raise ValueError("engine.url: the remote engine needs the vLLM server's URL")
        self.cfg = cfg
        self.tie_nats = tie_nats(cfg.dtype)  # "auto": bfloat16's, the widest (the server's dtype is not said)
        self._http: httpx.AsyncClient | None = None
        self._watch: ServerWatch | None = None
        self._model = ""
        self._max_len = cfg.max_model_len
        self._running = 0

    async def start(self, wait_s: float | None = None) -> RemoteEngine:
        """The tokenizer, then the server reached and checked (``identify``), waited for while it does not answer
        (a fleet may start after this replica: NOT_SERVING meanwhile) up to ``wait_s`` (None: for as long as it
        takes; then the last ``Unavailable``). ``WrongServer`` at once: another model is never used."""
        await asyncio.to_thread(self.load_tokenizer, self.cfg)
        self._http = remote_http.client(self.cfg)
        try:
            await self._first_contact(wait_s)
        except BaseException:
            await self._http.aclose()
            raise
        self._watch = ServerWatch(self._http, self.cfg, self.identify, lambda: self.last_output)
        self._watch.start(up=True)
        log.info("engine: the vLLM server at %s serves %r (context %d)", self.cfg.url, self._model, self._max_len)
        return self

    async def _first_contact(self, wait_s: float | None) -> None:
        t0 = said = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(self.cfg.probe_timeout_s * 10):
                    return await self.identify()
            except (Unavailable, TimeoutError) as exc:
                waited = time.monotonic() - t0
                if wait_s is not None and waited >= wait_s:
                    raise Unavailable(
                        f"engine: the vLLM server at {self.cfg.url} not reached in {waited:.0f} s"
                    ) from exc
                if time.monotonic() >= said:
                    log.warning("engine: waiting for the vLLM server at %s (%s)", self.cfg.url, exc or "timed out")
                    said = time.monotonic() + WAIT_LOG_S
            await asyncio.sleep(self.cfg.probe_period_s)

    async def identify(self) -> None:
        """The server serves the target: it lists the model (``cfg.remote_model``, or its only one), within this
        replica's context length, and tokenizes ``PROBE_TEXT`` as the local tokenizer does; ``WrongServer`` if
        not, ``Unavailable`` where it does not answer."""
        r = await remote_http.get(self._http, "/v1/models", self.cfg.probe_timeout_s)
        if r.status_code != 200:
            raise remote_http.refused(r.status_code, r.content)
        card = self._card(r.json().get("data") or [])
        server_len = int(card.get("max_model_len") or 0)
        if self.cfg.max_model_len and server_len and self.cfg.max_model_len > server_len:
            raise WrongServer(f"engine.max_model_len: {self.cfg.max_model_len} > the server's {server_len}")
        probe = PROBE_TEXT + (self._tok.eos_token or "")
        out = await remote_http.post(
            self._http,
            COMPLETIONS,
            {"model": card["id"], "prompt": probe, "max_tokens": 1, "temperature": 0, "return_token_ids": True},
        )
        theirs, ours = out["choices"][0].get("prompt_token_ids"), self._tok(probe)["input_ids"]
        if theirs != ours:
            at = next(
                (i for i, (a, b) in enumerate(zip(theirs or [], ours)) if a != b), min(len(theirs or []), len(ours))
            )
            raise WrongServer(
                f"engine.url: {self.cfg.url} serves {card['id']!r} (from {card.get('root')!r}), which tokenizes a probe "
                f"text unlike {self.cfg.model!r} ({len(theirs or [])} tokens against {len(ours)}, apart from token "
                f"{at} on): the server must serve the model engine.model names"
            )
        self._model, self._max_len = card["id"], self.cfg.max_model_len or server_len or self._max_len or 2048

    def _card(self, cards: list[dict]) -> dict:
        """The model card of the target among the server's."""
        names = [c.get("id") for c in cards]
        want = self.cfg.remote_model
        card = (
            next((c for c in cards if c.get("id") == want), None) if want else (cards[0] if len(cards) == 1 else None)
        )
        if card is None:
            said = (
                f"not {want!r} (engine.remote_model)" if want else "more than one: engine.remote_model names the target"
            )
            raise WrongServer(f"engine.url: {self.cfg.url} serves {names}, {said}")
        return card

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @property
    def watch(self) -> ServerWatch | None:
        """The server's health watch (None before ``start``)."""
        return self._watch

    # ---- requests ------------------------------------------------------------------------------------
    def _sampling(self, p: GenParams, room: int) -> dict:
        """A completion request's sampling, every field given: the server's defaults (its model's generation
        config) never fill one in, so that it samples as ``VllmEngine``'s SamplingParams do."""
        return {
            "max_tokens": min(p.max_tokens, room),
            "temperature": vllm_temperature(p.temperature),
            "top_p": p.top_p,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "seed": p.seed,
            "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty,
            "stop": list(p.stop),
            "stop_token_ids": sorted(self.stop_ids),
        }

    async def _run(self, ids: list[int], body: dict) -> AsyncIterator[dict]:
        """Every engine request goes through here: the server's state, the running count for Status, the cost,
        the time of the latest output (the heartbeat's). Streamed (``body["stream"]``): each event; else the
        one answer. A lost connection or a server's failure asks the health watch to probe now."""
        if self._watch is None or not self._watch.up:
            raise Unavailable(self._watch.why if self._watch else "engine: not started")
        body = {"model": self._model, "prompt": ids, "return_token_ids": True, **body}
        cost = current_cost()
        # the session's one cost counter names it (``metered``: one per session, shared by its parts' tasks)
        headers = {SESSION_HEADER: f"{id(cost):x}"} if cost is not None else None
        if body.get("stream"):
            body["stream_options"] = {"include_usage": True}
            if self.cfg.stream_interval > 1:  # vLLM's default otherwise (a server older than the field ignores it)
                body.setdefault("stream_interval", self.cfg.stream_interval)
            events = remote_http.stream(self._http, COMPLETIONS, body, headers)
        else:
            events = _once(lambda: remote_http.post(self._http, COMPLETIONS, body, headers))
        self._running += 1
        tally = RequestTally(prompt=len(ids), scored="prompt_logprobs" in body)
        try:
            async with contextlib.aclosing(events) as outs:
                async for out in outs:
                    self.last_output = time.monotonic()
                    # streamed: the new tokens only
                    samples = [(c["index"], len(c.get("token_ids") or ())) for c in out.get("choices") or ()]
                    tally.output(_cached(out.get("usage")), samples)
                    yield out
        except KeyRefused as exc:
            self._watch.fail(exc.message)
            raise
        except Unavailable:  # a lost connection (ServerGone), a server's failure: is it still there?
            self._watch.poke()
            raise
        finally:
            self._running -= 1
            tally.charge(cost)

    async def _complete(self, ids: list[int], body: dict) -> dict:
        """A request's one answer (not streamed)."""
        async with contextlib.aclosing(self._run(ids, body)) as outs:
            async for out in outs:
                return out
        raise Unavailable("engine: the vLLM server answered nothing")

    async def generate_ids(self, ids: list[int], params: GenParams, request_id: str) -> AsyncIterator[Chunk]:
        room = self.max_model_len - len(ids)
        if room < 1:
            return
        async with contextlib.aclosing(self._run(ids, self._sampling(params, room) | {"stream": True})) as outs:
            async for out in outs:
                for c in out.get("choices") or ():
                    text, toks, finish = c.get("text") or "", c.get("token_ids") or (), c.get("finish_reason")
                    if text or toks or finish:
                        yield Chunk(text, len(toks), finish)

    async def top_tokens(self, ids: list[int], start: int, request_id: str) -> tuple[list[int], list[float]]:
        """One full prefill with the top 2 at every position (the cache unread: see the module's docstring)."""
        plp, last = await self._prefill_rows(ids, start, 2, last=True)
        rows = [_prompt_top2(r) for r in plp] + [_sampled_top2(last)]
        return [r[0] for r in rows], [r[1] for r in rows]

    async def token_rows(self, ids: list[int], start: int, request_id: str, k: int) -> list[Row]:
        plp, _ = await self._prefill_rows(ids, start, k, last=False)
        return [
            sampled_row(
                [(lp["rank"], int(tok), lp["logprob"]) for tok, lp in r.items() if lp.get("rank") is not None], own, k
            )
            for r, own in zip(plp, ids[start:])
        ]

    async def _prefill_rows(self, ids: list[int], start: int, k: int, last: bool) -> tuple[list[dict], dict]:
        """The server's prompt-logprobs rows (top ``k``) of the positions from ``start`` on, and, where ``last``,
        the top ``k`` of the token after ``ids`` (keyed "token_id:N")."""
        if not 0 < start <= len(ids) < self.max_model_len:
            raise ValueError(f"top_tokens: start {start} out of 1..{len(ids)} (or past the context)")
        body = self._sampling(GenParams(max_tokens=1), 1) | {"prompt_logprobs": k}
        if last:  # the generated token's top k keyed "token_id:N"
            body |= {"logprobs": k, "return_tokens_as_token_ids": True}
        c = (await self._complete(ids, body))["choices"][0]
        plp, after = c.get("prompt_logprobs"), ((c.get("logprobs") or {}).get("top_logprobs") or [None])[0]
        if not plp or len(plp) < len(ids) or (last and not after):
            raise Unavailable("engine: the vLLM server returned no prompt logprobs")
        return plp[start : len(ids)], after

    async def sample_token(self, ids: list[int], params: GenParams, request_id: str, refused: int | None) -> int | None:
        if len(ids) >= self.max_model_len:
            return None
        body = self._sampling(dataclasses.replace(params, max_tokens=1, stop=()), 1)
        if refused is not None:
            body["logit_bias"] = {str(refused): REFUSED_BIAS}
        toks = (await self._complete(ids, body))["choices"][0].get("token_ids") or ()
        return int(toks[0]) if toks else None

    async def sample(self, prompt: str, params: GenParams, n: int, request_id: str, **extra) -> list[Chunk]:
        """``extra``: more fields of the request (``structured_outputs`` for the judge)."""
        ids, room = await self._prompt(prompt)
        if room < 1:
            return []
        out = await self._complete(ids, self._sampling(params, room) | {"n": n, **extra})
        choices = sorted(out.get("choices") or (), key=lambda c: c["index"])
        return [Chunk(c.get("text") or "", len(c.get("token_ids") or ()), c.get("finish_reason")) for c in choices]

    async def finished_samples(self, prompt: str, params: GenParams, n: int, request_id: str) -> AsyncIterator[Chunk]:
        ids, room = await self._prompt(prompt)
        if room < 1:
            return
        texts, tokens = [""] * n, [0] * n
        # only whole completions are read: their first token and their end sent, nothing between
        body = self._sampling(params, room) | {"n": n, "stream": True, "stream_interval": min(params.max_tokens, room)}
        async with contextlib.aclosing(self._run(ids, body)) as outs:
            async for out in outs:
                for c in out.get("choices") or ():  # the completions that advanced, by index
                    i = c["index"]
                    texts[i] += c.get("text") or ""
                    tokens[i] += len(c.get("token_ids") or ())
                    if c.get("finish_reason"):
                        yield Chunk(texts[i], tokens[i], c["finish_reason"])

    async def continuation_logprobs(
        self, prompt: str, continuation: str, request_id: str, end: bool = True
    ) -> list[float]:
        ids, start = await self._scored_span(prompt, continuation, end)
        if len(ids) <= start or start == 0:
            return []
        body = self._sampling(GenParams(max_tokens=1), 1) | {"prompt_logprobs": 0}
        plp = (await self._complete(ids, body))["choices"][0].get("prompt_logprobs")
        if not plp or len(plp) < len(ids):
            raise Unavailable("engine: the vLLM server returned no prompt logprobs")
        return [float(plp[pos][str(ids[pos])]["logprob"]) for pos in range(start, len(ids))]

    async def judge(self, prompt: str, schema: dict, max_tokens: int, request_id: str) -> str:
        out = await self.sample(
            prompt, GenParams(max_tokens=max_tokens), 1, request_id, structured_outputs={"json": schema}
        )
        return out[0].text if out else ""

    async def abort(self, request_id: str) -> None:
        """Nothing to do: a request is aborted on the server when its caller stops reading (its connection closes)."""

    # ---- health and load ------------------------------------------------------------------------------
    async def check_health(self) -> None:
        if self._watch is None or not self._watch.up:
            raise Unavailable(self._watch.why if self._watch else "engine: not started")

    async def heartbeat(self, timeout_s: float) -> None:
        """The server answers its probes, and a one-token request where none of this replica's has had output
        within ``timeout_s`` (a server answering requests is not hung: no probe request among them)."""
        await self.check_health()
        if time.monotonic() - self.last_output >= timeout_s:
            await super().heartbeat(timeout_s)

    async def health_changed(self) -> None:
        if self._watch is None:
            await asyncio.Event().wait()
        await self._watch.changed()

    def stats(self) -> EngineStats:
        load = self._watch.load if self._watch else ServerLoad()
        return EngineStats(
            # the server's own count where it says more: other clients of a shared server load it too
            max(self._running, load.running),
            self.cfg.max_num_seqs,
            bool(self._watch and self._watch.up),
            waiting=load.waiting,
            kv_cache_usage=load.kv_cache_usage,
        )

    async def close(self, wait_s: float | None = None) -> None:
        """Stop probing and close the connections (requests still open end with them); the server runs on."""
        if self._watch is not None:
            await self._watch.close()
        if self._http is not None:
            await self._http.aclose()


async def _once(answer: Callable[[], Awaitable[dict]]) -> AsyncIterator[dict]:
    """A non-streamed request as a stream of its one answer (asked only once iterated)."""
    yield await answer()


def _cached(usage: dict | None) -> int:
    """Prefix-cache hits in a usage block (0 where the server does not say: no ``--enable-prompt-tokens-details``)."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _prompt_top2(row: dict) -> tuple[int, float]:
    """``top2`` of a prompt-logprobs row as the server writes it: token id (a string) -> {logprob, rank, ...}."""
    return top2([(lp["rank"], int(tok), lp["logprob"]) for tok, lp in row.items() if lp.get("rank") is not None])


def _sampled_top2(row: dict) -> tuple[int, float]:
    """``top2`` of a generated token's top logprobs as the server writes them: "token_id:N" -> logprob (no ranks:
    ranked by logprob, ties in the server's order)."""
    ranked = sorted(row.items(), key=lambda kv: -kv[1])
    return top2([(i + 1, int(tok.rsplit(":", 1)[1]), lp) for i, (tok, lp) in enumerate(ranked)])
