"""The target-model engine behind a small interface, and its vLLM implementation.

One engine serves both verification scoring (prompt logprobs of a draft) and
refinement (streamed generation). vLLM's AsyncLLM batches every request from
every session continuously; nothing here serialises requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from coinfer.chat import ChatFormat, ChatMessage
from coinfer.cloud.config import EngineConfig
from coinfer.errors import InvalidArgument, Reason, Unavailable
from coinfer.serving import logs
from coinfer.types import CloudCost, Draft

log = logging.getLogger(__name__)

LOOP_STALL_S = 5.0
"""A heartbeat's timeout firing this much later than set means the event loop stood still meanwhile
(a sync test's minutes-long model build freezes an in-process server's loop; a process stopped): the
engine's outputs went unread, which proves nothing about the engine (a live loop is late by
milliseconds)."""

# The session whose engine requests are being counted. A context variable rather than an argument
# threaded through every call: the session's parts call the engine from tasks they start, and a task
# copies the context it was created in, so each of them adds to the session's one CloudCost.
_COST: contextvars.ContextVar[CloudCost | None] = contextvars.ContextVar("coinfer_cloud_cost", default=None)


def metered() -> CloudCost:
    """Count the engine work of the current task, and of the tasks it starts from now on, into a
    new ``CloudCost`` (returned): call it where a session begins."""
    cost = CloudCost()
    _COST.set(cost)
    return cost


def _count(cost: CloudCost | None, prompt: int, cached: int, decoded: int) -> None:
    """Fold one vLLM request (its prompt, prefix-cache hits and generated tokens) into ``cost``."""
    if cost is None:
        return
    cost.engine_requests += 1
    cost.prompt_tokens += prompt
    cost.cached_tokens += cached
    cost.decoded_tokens += decoded


@dataclass
class GenParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Chunk:
    """Generated text and how many tokens it took (a chunk may carry tokens and no text: EOS)."""

    text: str
    tokens: int
    finish_reason: str | None = None
    """On the last chunk: "stop" or "length" (vLLM's; "abort" when cancelled); None before it."""


@dataclass
class EngineStats:
    running: int
    """Requests this process has in the engine (scoring, refinement, sampling)."""
    max_num_seqs: int
    ready: bool
    waiting: int = 0
    """vLLM scheduler's waiting queue (from its stat logger; 0 until the first engine step)."""
    kv_cache_usage: float = 0.0
    """vLLM's KV-cache use in [0, 1]."""

    @property
    def load(self) -> float:
        """One number in [0, 1] for the draft-count controller: the busier of slot use
        (running + waiting over the batch size) and KV-cache use."""
        slots = (max(self.running, 0) + self.waiting) / max(1, self.max_num_seqs)
        return min(1.0, max(slots, self.kv_cache_usage))


class TargetEngine(ABC):
    """What the cloud needs from a model server. Prompts are model input text: a conversation
    rendered with ``render`` (the target's own chat template)."""

    chat: ChatFormat = ChatFormat()

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The model's input for a conversation, ending where the assistant's answer starts. A conversation the
        template refuses (``raise_exception``: Gemma's alternating roles) is the request's error, as vLLM
        answers it (400), not the server's; a chat-form request to a model without one is ``NoChatTemplate``."""
        from jinja2.exceptions import TemplateError

        try:
            return self.chat.render(messages)
        except TemplateError as exc:
            raise InvalidArgument(
                f"messages: the target's chat template ({self.chat.source or 'the model'}) refuses this "
                f"conversation: {str(exc)[:200]}",
                field="messages",
            ) from None

    def in_target_tokens(self, d: Draft) -> Draft:
        """Draft ``d`` counted in this model's tokens. The edge counts a draft's tokens and its mean logprob in
        the draft model's vocabulary, which need not be the target's (SmolLM2 drafting for Gemma 3: 49k and
        262k tokens); the cloud's budgets (a cut draft continued to the answer's budget, the refinement's
        length) and the likelihood thresholds (the draft model's own mean against the target's, per token)
        read them in the target's. The draft model's total logprob is kept: its mean is restated per target
        token. The default: unchanged (an engine without a tokenizer of its own, the tests' stand-ins)."""
        return d

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as this model tokenizes it (usage reporting)."""

    @abstractmethod
    def generate(self, prompt: str, params: GenParams, request_id: str) -> AsyncIterator[Chunk]:
        """Stream deltas of a completion of ``prompt`` (BOS added by the tokenizer)."""

    @abstractmethod
    async def sample(self, prompt: str, params: GenParams, n: int, request_id: str) -> list[Chunk]:
        """``n`` independent completions of ``prompt`` in one request (not streamed)."""

    async def finished_samples(self, prompt: str, params: GenParams, n: int, request_id: str) -> AsyncIterator[Chunk]:
        """The ``n`` completions of ``sample``, each as soon as it has finished (first finished first),
        so that a caller that wants the first acceptable one stops there: leaving the iteration early
        aborts the others. Engines that cannot stream a batch of samples yield ``sample``'s in order."""
        for c in await self.sample(prompt, params, n, request_id):
            yield c

    @abstractmethod
    async def continuation_logprobs(
        self, prompt: str, continuation: str, request_id: str, end: bool = True
    ) -> list[float]:
        """Log-probability of each token of ``continuation`` (then end of turn, unless ``end`` is
        False: a text cut at its token budget did not end there, and the end-of-turn token after a
        half sentence scored -27 nats, failing every truncated draft) given ``prompt``:
        ``prompt + continuation`` tokenized together, the continuation's tokens being those that
        end past the prompt's last character (so a BPE merge across the boundary is scored as the
        model would read it, not as two fragments it never saw)."""

    @abstractmethod
    async def judge(self, prompt: str, schema: dict, max_tokens: int, request_id: str) -> str:
        """Greedy completion of ``prompt`` constrained to JSON matching ``schema``."""

    @abstractmethod
    async def abort(self, request_id: str) -> None: ...

    @abstractmethod
    async def check_health(self) -> None:
        """Raise Unavailable if the engine is dead."""

    last_output: float = 0.0
    """``time.monotonic()`` of the engine's latest output to any request (0: none yet)."""

    async def heartbeat(self, timeout_s: float) -> None:
        """The seed's verifier heartbeat: alive, and a one-token request answered within ``timeout_s``.
        Raise Unavailable naming why; an engine that is slow to answer but still producing output
        for other requests is busy, not hung. Nor is one whose outputs this process's own event loop
        could not read: where the timeout fired more than ``LOOP_STALL_S`` late, the loop stood still
        (a blocking call on it, the process stopped or starved), and the next heartbeat asks again."""
        await self.check_health()
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                async for _ in self.generate("ping", GenParams(max_tokens=1), f"heartbeat-{time.monotonic_ns()}"):
                    pass
        except TimeoutError:
            now = time.monotonic()
            if now - self.last_output < timeout_s:
                return
            if (late := now - t0 - timeout_s) > LOOP_STALL_S:
                log.warning("heartbeat: this process's event loop stood still for %.0f s; not the engine's fault", late)
                return
            raise Unavailable(f"engine: hung (no output for {timeout_s:g} s)", reason=Reason.ENGINE_HUNG) from None

    @abstractmethod
    def stats(self) -> EngineStats: ...

    @property
    @abstractmethod
    def max_model_len(self) -> int: ...

    async def close(self, wait_s: float | None = None) -> None:  # noqa: B027 - optional
        """Stop the engine. ``wait_s``: how long its processes get to exit before they are killed (None: the
        engine's default); a failed engine is closed with 0, nothing in it being worth waiting for."""


OFF_LOOP_CHARS = 4096
"""Texts longer than this are tokenized off the event loop."""

VLLM_MIN_TEMPERATURE = 0.01
"""vLLM raises a temperature in (0, 0.01) to 0.01 (smaller ones overflow) and logs a warning for each
request; a client sending 1e-45 would fill the log. We raise it ourselves, silently."""


def vllm_temperature(t: float) -> float:
    return t if t == 0 or t >= VLLM_MIN_TEMPERATURE else VLLM_MIN_TEMPERATURE


def engine_args(cfg: EngineConfig) -> dict:
    """vLLM's engine arguments for ``cfg`` (``AsyncEngineArgs`` here; tests load the same arguments into
    vLLM's offline ``LLM``)."""
    return dict(
        model=cfg.model,
        tokenizer=cfg.model,
        max_model_len=cfg.max_model_len or None,
        served_model_name=cfg.model_name,
        dtype=cfg.dtype,
        max_num_seqs=cfg.max_num_seqs,
        enforce_eager=cfg.enforce_eager,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        seed=cfg.seed,
        disable_log_stats=True,
        enable_prefix_caching=True,
        tensor_parallel_size=cfg.tensor_parallel_size,
        data_parallel_size=cfg.data_parallel_size,
        speculative_config=(
            {
                "method": "ngram",
                "num_speculative_tokens": cfg.ngram_speculative_tokens,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            }
            if cfg.ngram_speculative_tokens
            else None
        ),
    )


def chat_format(cfg: EngineConfig) -> ChatFormat:
    """How the target reads a conversation: its directory's template, or the file ``cfg.chat_template`` names
    (vLLM's ``--chat-template``: a base model without one, e.g. Gemma 3 270M)."""
    fmt = ChatFormat.from_dir(cfg.model)
    if cfg.chat_template:
        fmt = fmt.with_template(Path(cfg.chat_template).read_text(encoding="utf-8"), f"{cfg.chat_template}")
    return fmt


@functools.lru_cache(maxsize=8)
def _special_ids(tok) -> frozenset[int]:
    """Ids of ``tok``'s special tokens (its added tokens marked special and the named ones)."""
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    return frozenset([i for i, t in added.items() if getattr(t, "special", False)] + list(tok.all_special_ids))


def template_ids(chat: ChatFormat, tok) -> tuple[int, frozenset[int]]:
    """(end-of-turn id, stop ids) of chat format ``chat`` in tokenizer ``tok``. The end of turn is the special
    token the template writes after an answer (``<end_of_turn>`` for Gemma's template, whose tokenizer's eos
    is ``<eos>``); without a template, or when it ends a turn with ordinary text, the tokenizer's eos. The
    stop ids: the template's turn markers other than the BOS (an answer that opens another turn has ended:
    a base model given a template can write ``<start_of_turn>user``), with the end of turn; the model's own
    eos stays one too (vLLM's)."""
    end = tok.eos_token_id
    if not chat.templated:
        return end, frozenset()
    specials = _special_ids(tok)
    after = tok(chat.after_answer(), add_special_tokens=False)["input_ids"]
    if after and after[0] in specials:
        end = after[0]
    turns = chat.render([ChatMessage("user", "u"), ChatMessage("assistant", "a"), ChatMessage("user", "v")])
    marks = {i for i in tok(turns, add_special_tokens=False)["input_ids"] if i in specials}
    return end, frozenset((marks | {end}) - {tok.bos_token_id, None})


def restated(d: Draft, target_tokens: int) -> Draft:
    """Draft ``d`` with its token count and mean logprob in the target's tokens (``target_tokens``: its text,
    and its end of turn unless cut): the draft model's total logprob over them. A draft whose model reported
    no logprob (0) keeps 0; a count of 0 on either side leaves the draft as it came."""
    if target_tokens < 1 or d.num_tokens < 1:
        return d
    mean = d.mean_logprob * d.num_tokens / target_tokens if d.mean_logprob < 0 else d.mean_logprob
    return dataclasses.replace(d, num_tokens=target_tokens, mean_logprob=mean)


class VllmEngine(TargetEngine):
    """vLLM AsyncLLM (v1 engine). Create inside a running event loop via ``start``."""

    def __init__(self, cfg: EngineConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self._llm = None
        self._tok = None
        self._running = 0
        self._sched = None  # last vLLM SchedulerStats, written by the stat logger below
        self.end_id: int | None = None
        """The token scored after a finished draft: the template's end of turn (``template_ids``)."""
        self.stop_ids: frozenset[int] = frozenset()
        """Tokens that end every generation besides the model's eos: the template's turn markers."""
        self.scores_end = True
        """Whether a finished draft's end of turn is scored. Not for a base model given a template it was never
        trained on (``EngineConfig.chat_template`` over a directory without one): its end-of-turn token says
        nothing of the answer (Gemma 3 270M base: -25 nats after "The capital of France is Paris.", which
        failed every finished draft)."""

    def _stat_logger_factory(self):
        """vLLM calls the factory once per engine; its logger gets SchedulerStats every step."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        engine = self

        class _Recorder(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
                if scheduler_stats is not None:
                    engine._sched = scheduler_stats

            def log_engine_initialized(self) -> None:
                pass

        return _Recorder

    async def start(self) -> VllmEngine:
        # the CPU build sizes its KV cache from this variable; it is read at engine start
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(self.cfg.kv_cache_gib))))
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_args(self.cfg))
        # engine start is blocking (spawns the engine-core process, loads weights)
        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args, stat_loggers=[self._stat_logger_factory()])
        logs.limit_handlers("vllm")  # its own stdout handler: per-request warnings are client-driven
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(self.cfg.model)
        self.chat = chat_format(self.cfg)
        self._templated()
        self.scores_end = not self.cfg.chat_template or ChatFormat.from_dir(self.cfg.model).templated
        mc = getattr(self._llm, "model_config", None)
        self._max_len = int(getattr(mc, "max_model_len", 0) or self.cfg.max_model_len or 2048)
        # the first request pays for lazy kernel and allocator set-up (seconds on CPU):
        # pay it here, before health says SERVING, not in a user's session
        await self.continuation_logprobs("warm up", "warm up", "warmup-score")
        async for _ in self.generate("warm up", GenParams(max_tokens=2), "warmup-gen"):
            pass
        return self

    @property
    def max_model_len(self) -> int:
        return self._max_len

    @staticmethod
    async def _off_loop(chars: int, fn, *args):
        """``fn(*args)``, in a worker thread when it tokenizes over ``OFF_LOOP_CHARS`` characters (the
        tokenizer releases the GIL): ~1 ms per KiB, and a prompt, its drafts and a continuation reach tens
        of KiB (66 ms on the loop was seen)."""
        return fn(*args) if chars <= OFF_LOOP_CHARS else await asyncio.to_thread(fn, *args)

    def _ids(self, text: str) -> list[int]:
        # a chat template writes the BOS itself: adding special tokens would double it
        return self._tok(text, add_special_tokens=not self.chat.templated)["input_ids"]

    def count_tokens(self, text: str) -> int:
        return len(self._tok(text, add_special_tokens=False)["input_ids"])

    def in_target_tokens(self, d: Draft) -> Draft:
        # the text as the verifier scores it (a special token's text split: ``span_ids``), then its end of turn
        n = len(self._tok(d.text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        return restated(d, n + (not d.truncated and self.scores_end))

    def _templated(self) -> None:
        """The end-of-turn and turn-marker ids of the chat format in force (``template_ids``)."""
        self.end_id, self.stop_ids = template_ids(self.chat, self._tok)

    def span_ids(self, prompt: str, continuation: str) -> tuple[list[int], int]:
        """(ids of prompt + continuation tokenized together, index of the continuation's first token). A
        continuation holding the text of one of this model's special tokens (a draft model's ``<end_of_turn>``
        written out, another model's ``<|im_end|>`` that is special here too) is scored as the text it is, not
        as a turn marker the draft never wrote: then the two are tokenized apart, the continuation's specials
        split."""
        enc = self._tok(prompt + continuation, add_special_tokens=not self.chat.templated, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        start = next((i for i, (_, end) in enumerate(offsets) if end > len(prompt)), len(ids))
        if not _special_ids(self._tok).isdisjoint(ids[start:]):
            head = self._ids(prompt)
            tail = self._tok(continuation, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            return list(head) + list(tail), len(head)
        return list(ids), start

    def _params(self, p: GenParams, room: int, delta: bool = True, **extra):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=min(p.max_tokens, room),
            temperature=vllm_temperature(p.temperature),
            top_p=p.top_p,
            seed=p.seed,
            presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            stop=list(p.stop) or None,
            stop_token_ids=sorted(self.stop_ids) or None,
            output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
            **extra,
        )

    async def _run(self, ids: list[int], sp, request_id: str) -> AsyncIterator:
        """Every engine request goes through here: liveness check, the running count
        for Status, and abort upstream when the caller is cancelled (then re-raise)."""
        if self._llm is None or self._llm.errored:
            raise Unavailable("engine is not running")
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        self._running += 1
        cost, delta, decoded, cached, seen = _COST.get(), sp.output_kind == RequestOutputKind.DELTA, 0, 0, False
        try:
            # closed with the caller's iteration (each generator in the chain closes the one it reads),
            # so that a caller that stops early aborts the request now, not when the collector runs
            async with contextlib.aclosing(self._llm.generate({"prompt_token_ids": ids}, sp, request_id)) as outs:
                async for out in outs:
                    self.last_output = time.monotonic()
                    n = sum(len(c.token_ids) for c in out.outputs)  # delta outputs: the new tokens only
                    decoded, seen = decoded + n if delta else n, True
                    cached = max(cached, out.num_cached_tokens or 0)
                    yield out
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise
        except (EngineDeadError, EngineGenerateError) as exc:  # the server's fault: the edge replays elsewhere
            raise Unavailable("engine: stopped; retry (the replica restarts it)") from exc
        finally:
            self._running -= 1
            if seen:  # aborted requests too: what they computed was spent
                _count(cost, len(ids), cached, decoded)

    async def _prompt(self, prompt: str) -> tuple[list[int], int]:
        """(token ids of ``prompt``, tokens of context left after it): tokenized off the loop."""
        ids = await self._off_loop(len(prompt), self._ids, prompt)
        return ids, self.max_model_len - len(ids)

    async def generate(self, prompt: str, params: GenParams, request_id: str) -> AsyncIterator[Chunk]:
        ids, room = await self._prompt(prompt)
        if room < 1:
            return
        async with contextlib.aclosing(self._run(ids, self._params(params, room), request_id)) as outs:
            async for out in outs:
                c = out.outputs[0]
                if c.text or c.token_ids or c.finish_reason:
                    yield Chunk(c.text, len(c.token_ids), c.finish_reason)

    async def sample(self, prompt: str, params: GenParams, n: int, request_id: str, **extra) -> list[Chunk]:
        """``extra``: more vLLM SamplingParams (structured outputs for the judge)."""
        ids, room = await self._prompt(prompt)
        if room < 1:
            return []
        sp = self._params(params, room, delta=False, n=n, **extra)
        outs = [out async for out in self._run(ids, sp, request_id)]
        return [Chunk(c.text, len(c.token_ids), c.finish_reason) for c in outs[-1].outputs] if outs else []

    async def finished_samples(self, prompt: str, params: GenParams, n: int, request_id: str) -> AsyncIterator[Chunk]:
        ids, room = await self._prompt(prompt)
        if room < 1:
            return
        texts, tokens = [""] * n, [0] * n
        async with contextlib.aclosing(self._run(ids, self._params(params, room, n=n), request_id)) as outs:
            async for out in outs:
                for c in out.outputs:  # streamed with n > 1: the completions that advanced, by index
                    texts[c.index] += c.text
                    tokens[c.index] += len(c.token_ids)
                    if c.finish_reason:
                        yield Chunk(texts[c.index], tokens[c.index], c.finish_reason)

    async def continuation_logprobs(
        self, prompt: str, continuation: str, request_id: str, end: bool = True
    ) -> list[float]:
        ids, start = await self._off_loop(len(prompt) + len(continuation), self.span_ids, prompt, continuation)
        ids = (ids + [self.end_id] * (end and self.scores_end))[: self.max_model_len - 1]
        if len(ids) <= start or start == 0:
            return []
        plp = None
        async for out in self._run(ids, self._params(GenParams(max_tokens=1), 1, prompt_logprobs=0), request_id):
            plp = out.prompt_logprobs or plp  # delta outputs: they come with the first one
        if plp is None:
            raise Unavailable("engine returned no prompt logprobs")
        return [float(plp[pos][ids[pos]].logprob) for pos in range(start, len(ids))]

    async def judge(self, prompt: str, schema: dict, max_tokens: int, request_id: str) -> str:
        from vllm.sampling_params import StructuredOutputsParams

        out = await self.sample(
            prompt,
            GenParams(max_tokens=max_tokens),
            1,
            request_id,
            structured_outputs=StructuredOutputsParams(json=schema),
        )
        return out[0].text if out else ""

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    async def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes: a benchmark that sends the same prompts under several plans
        starts each plan cold, so that a later plan does not run on an earlier one's cache."""
        if self._llm is not None:
            await self._llm.reset_prefix_cache()

    async def check_health(self) -> None:
        if self._llm is None:
            raise Unavailable("engine is loading")
        try:
            await self._llm.check_health()
        except Exception as exc:
            raise Unavailable(f"engine is dead: {exc}") from exc

    def stats(self) -> EngineStats:
        sched = self._sched
        return EngineStats(
            self._running,
            self.cfg.max_num_seqs,
            self._llm is not None and not self._llm.errored,
            waiting=getattr(sched, "num_waiting_reqs", 0),
            kv_cache_usage=float(getattr(sched, "kv_cache_usage", 0.0)),
        )

    async def close(self, wait_s: float | None = None) -> None:
        if self._llm is not None:
            llm, self._llm = self._llm, None
            # requests still waiting on a hung engine fail now (UNAVAILABLE: the edge replays them
            # elsewhere) instead of at their deadlines; this is how vLLM fails them when its core dies
            from vllm.v1.engine.exceptions import EngineDeadError

            outputs = getattr(llm, "output_processor", None)
            if outputs is not None:
                outputs.propagate_error(EngineDeadError())
            # vLLM stops its engine core before it cancels the task that reads the core's outputs,
            # which then logs "ERROR AsyncLLM output_handler failed ... EngineDeadError" on every
            # normal drain: the reader is ours to stop first (it runs on this loop)
            handler = getattr(llm, "output_handler", None)
            if isinstance(handler, asyncio.Task) and not handler.done():
                handler.cancel()
                await asyncio.gather(handler, return_exceptions=True)
            # waits for the engine processes (vLLM's default: 5 s, then they are killed): off the loop
            await asyncio.to_thread(llm.shutdown, wait_s)
