"""The target engine on vLLM's AsyncLLM (v1 engine), in this process (``VllmEngine``).

One engine serves verification scoring (prompt logprobs of a draft), exact checks of a draft's tokens
(``top_tokens``: prompt logprobs with the top-1 token, prefix cache read) and generation (streamed);
AsyncLLM batches every request from every session continuously.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from coinfer.chat import ChatFormat, ChatMessage
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.engine import (
    Chunk,
    EngineStats,
    GenParams,
    TargetEngine,
    TokenDecoder,
    current_cost,
    restated,
)
from coinfer.errors import Unavailable
from coinfer.serving import logs
from coinfer.types import Draft

log = logging.getLogger(__name__)

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
        block_size=cfg.block_size,
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
        self.tie_nats = tie_nats(str(getattr(mc, "dtype", self.cfg.dtype)))
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
        cost, delta, cached, seen = current_cost(), sp.output_kind == RequestOutputKind.DELTA, 0, False
        per_sample: dict[int, int] = {}
        try:
            # closed with the caller's iteration (each generator in the chain closes the one it reads),
            # so that a caller that stops early aborts the request now, not when the collector runs
            async with contextlib.aclosing(self._llm.generate({"prompt_token_ids": ids}, sp, request_id)) as outs:
                async for out in outs:
                    self.last_output = time.monotonic()
                    for c in out.outputs:  # delta outputs: the new tokens only
                        per_sample[c.index] = per_sample.get(c.index, 0) * delta + len(c.token_ids)
                    seen = True
                    cached = max(cached, out.num_cached_tokens or 0)
                    yield out
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise
        except (EngineDeadError, EngineGenerateError) as exc:  # the server's fault: the edge replays elsewhere
            raise Unavailable("engine: stopped; retry (the replica restarts it)") from exc
        finally:
            self._running -= 1
            if seen and cost is not None:  # aborted requests too: what they computed was spent
                cost.add_request(
                    prompt=len(ids),
                    cached=cached,
                    decoded=sum(per_sample.values()),
                    longest=max(per_sample.values(), default=0),
                    scored=sp.prompt_logprobs is not None,
                )

    async def _prompt(self, prompt: str) -> tuple[list[int], int]:
        """(token ids of ``prompt``, tokens of context left after it): tokenized off the loop."""
        ids = await self._off_loop(len(prompt), self._ids, prompt)
        return ids, self.max_model_len - len(ids)

    async def generate(self, prompt: str, params: GenParams, request_id: str) -> AsyncIterator[Chunk]:
        ids, _ = await self._prompt(prompt)
        async with contextlib.aclosing(self.generate_ids(ids, params, request_id)) as chunks:
            async for c in chunks:
                yield c

    async def generate_ids(self, ids: list[int], params: GenParams, request_id: str) -> AsyncIterator[Chunk]:
        room = self.max_model_len - len(ids)
        if room < 1:
            return
        async with contextlib.aclosing(self._run(ids, self._params(params, room), request_id)) as outs:
            async for out in outs:
                c = out.outputs[0]
                if c.text or c.token_ids or c.finish_reason:
                    yield Chunk(c.text, len(c.token_ids), c.finish_reason)

    # ---- token level (``coinfer.cloud.speculation``) --------------------------------------------------
    speculative = True

    async def prompt_ids(self, prompt: str) -> list[int]:
        ids, _ = await self._prompt(prompt)
        return ids

    async def text_ids(self, text: str) -> list[int]:
        return await self._off_loop(len(text), self._text_ids, text)

    def _text_ids(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    async def top_tokens(self, ids: list[int], start: int, request_id: str) -> tuple[list[int], list[float]]:
        """One prefill with the top-1 token at every position (vLLM's prompt logprobs, 1), reading the prefix
        cache: positions the cache covered come without logprobs (vLLM leaves their rows unwritten), so a
        hit that reaches past ``start - 1`` is asked again without the cache (the positions before ``start``
        are the prompt and the answer so far: a hit there is the common case and costs nothing)."""
        if not 0 < start <= len(ids) < self.max_model_len:
            raise ValueError(f"top_tokens: start {start} out of 1..{len(ids)} (or past the context)")
        for reuse in (True, False):
            # detokenize off: rows the cache covered hold whatever memory vLLM left there, and decoding their
            # "token ids" (negative ones) failed vLLM's output handler for every request in flight
            sp = self._params(
                GenParams(max_tokens=1),
                1,
                prompt_logprobs=2,
                logprobs=2,
                skip_reading_prefix_cache=not reuse,
                detokenize=False,
            )
            plp, cached, last = None, 0, None
            async for out in self._run(ids, sp, request_id if reuse else f"{request_id}-full"):
                plp = out.prompt_logprobs or plp  # delta outputs: they come with the first one
                cached = max(cached, out.num_cached_tokens or 0)
                if out.outputs and out.outputs[0].logprobs:
                    last = out.outputs[0].logprobs[0]
            if plp is None or last is None:
                raise Unavailable("engine returned no prompt logprobs")
            if cached < start:  # position p's row is p - 1: computed where p - 1 >= cached
                rows = [_top2(plp[pos]) for pos in range(start, len(ids))] + [_top2(last)]
                return [r[0] for r in rows], [r[1] for r in rows]
        raise Unavailable("engine: prompt logprobs missing after a full prefill")

    def decoder(self, ids: list[int]) -> TokenDecoder:
        return _StreamDecoder(self._tok, ids)

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


TIE_NATS = {"bfloat16": 0.25, "float16": 0.06, "float32": 1e-3}
"""Leads of the argmax under which a prefill and a decode step may pick different tokens, by the engine's dtype:
about two units in the last place of a logit of magnitude 10-30 (bfloat16 keeps 8 bits: SmolLM2-135M on this
CPU, 12 prompts x 96 tokens, split 8 at leads of 0 to 0.125 nats; float32: none)."""


def tie_nats(dtype: str) -> float:
    """``TargetEngine.tie_nats`` for a model running in ``dtype`` ("torch.bfloat16" or "bfloat16")."""
    return TIE_NATS.get(dtype.removeprefix("torch."), TIE_NATS["bfloat16"])


def _top2(row: dict) -> tuple[int, float]:
    """(argmax token, its lead in nats over the runner-up) of one logprobs row: the actual token and the top 2,
    each with its rank (the lead is infinite where vLLM reports no runner-up: a vocabulary of one)."""
    ranked = sorted(((lp.rank, tok, lp.logprob) for tok, lp in row.items() if lp.rank is not None), key=lambda r: r[0])
    top = ranked[0]
    second = next((r for r in ranked if r[0] == 2), None)
    return int(top[1]), (top[2] - second[2]) if second is not None else math.inf


class _StreamDecoder(TokenDecoder):
    """vLLM's own detokenization of a generation (its ``FastIncrementalDetokenizer``: the tokenizers library's
    ``DecodeStream`` primed with the prompt, special tokens skipped), so that tokens taken from a draft read
    as the same text the engine would have streamed for them."""

    def __init__(self, tok, ids: list[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self._tok = tok.backend_tokenizer
        self._stream = DecodeStream(ids=list(ids), skip_special_tokens=True)

    def step(self, token: int) -> str | None:
        return self._stream.step(self._tok, token)
