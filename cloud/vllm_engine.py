"""The target engine on vLLM's AsyncLLM (v1 engine), in this process (``VllmEngine``).

One engine serves verification scoring (prompt logprobs of a draft), exact checks of a draft's tokens
(``top_tokens``: prompt logprobs with the top-1 token, prefix cache read) and generation (streamed);
AsyncLLM batches every request from every session continuously.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence

from coinfer.cloud.checked_rows import CheckedRows, TopRow, context_keys
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.draft_proposer import ADD_DRAFTS, DRAFTS_KEY, DRAFTS_REFUSED, KEY_KEY, DraftProposer
from coinfer.cloud.engine import Chunk, EngineStats, GenParams, current_cost
from coinfer.cloud.sampled import Row
from coinfer.cloud.vllm_common import (
    REFUSED_BIAS,
    TokenizingEngine,
    engine_dtype,
    sampled_row,
    tie_nats,
    top2,
    vllm_temperature,
)
from coinfer.errors import Unavailable
from coinfer.serving import logs
from coinfer.types import RequestTally

log = logging.getLogger(__name__)


def engine_args(cfg: EngineConfig) -> dict:
    """vLLM's engine arguments for ``cfg`` (``AsyncEngineArgs`` here; tests load the same arguments into
    vLLM's offline ``LLM``)."""
    return dict(
        model=cfg.model,
        tokenizer=cfg.model,
        max_model_len=cfg.max_model_len or None,
        served_model_name=cfg.model_name,
        dtype=engine_dtype(cfg.dtype),
        max_num_seqs=cfg.max_num_seqs,
        enforce_eager=cfg.enforce_eager,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        seed=cfg.seed,
        disable_log_stats=True,
        enable_prefix_caching=True,
        block_size=cfg.block_size,
        tensor_parallel_size=cfg.tensor_parallel_size,
        data_parallel_size=cfg.data_parallel_size,
        speculative_config=_speculative_config(cfg),
        # each request's proposed and accepted draft tokens on its last output (``Chunk.offered``)
        per_request_spec_decode_metrics="summary" if cfg.draft_speculative_tokens else "none",
    )


def _speculative_config(cfg: EngineConfig) -> dict | None:
    if cfg.draft_speculative_tokens:
        return {
            "method": "custom_class",
            "model": f"{DraftProposer.__module__}.{DraftProposer.__qualname__}",
            "num_speculative_tokens": cfg.draft_speculative_tokens,
        }
    if cfg.ngram_speculative_tokens:
        return {
            "method": "ngram",
            "num_speculative_tokens": cfg.ngram_speculative_tokens,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    return None


class VllmEngine(TokenizingEngine):
    """vLLM AsyncLLM (v1 engine). Create inside a running event loop via ``start``."""

    def __init__(self, cfg: EngineConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self._llm = None
        self._tok = None
        self._running = 0
        self._sched = None  # last vLLM SchedulerStats, written by the stat logger below
        self._checked = CheckedRows()

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
        self.load_tokenizer(self.cfg)
        mc = getattr(self._llm, "model_config", None)
        self._max_len = int(getattr(mc, "max_model_len", 0) or self.cfg.max_model_len or 2048)
        self.vocab_size = max(self.vocab_size, int(getattr(mc, "get_vocab_size", lambda: 0)() or 0))
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

    def _params(self, p: GenParams, room: int, delta: bool = True, every: int = 0, **extra):
        """``every``: a streamed output's tokens (``stream_interval``; 0: ``cfg.stream_interval``)."""
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
            stream_interval=(every or self.cfg.stream_interval) if delta else None,
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
        cost, delta = current_cost(), sp.output_kind == RequestOutputKind.DELTA
        tally = RequestTally(
            prompt=len(ids), scored=sp.prompt_logprobs is not None, stepwise=DRAFTS_KEY in (sp.extra_args or {})
        )
        t0 = time.perf_counter()
        try:
            # closed with the caller's iteration (each generator in the chain closes the one it reads),
            # so that a caller that stops early aborts the request now, not when the collector runs
            async with contextlib.aclosing(self._llm.generate({"prompt_token_ids": ids}, sp, request_id)) as outs:
                async for out in outs:
                    self.last_output = time.monotonic()
                    samples = [(c.index, len(c.token_ids)) for c in out.outputs]
                    tally.output(out.num_cached_tokens or 0, samples, delta=delta)
                    yield out
        except asyncio.CancelledError:
            await self.abort(request_id)
            raise
        except (EngineDeadError, EngineGenerateError) as exc:  # the server's fault: the edge replays elsewhere
            raise Unavailable("engine: stopped; retry (the replica restarts it)") from exc
        finally:
            self._running -= 1
            tally.charge(cost)
            if log.isEnabledFor(logging.DEBUG):  # one line per engine request: what a session's answer cost, by kind
                log.debug(
                    "engine request %s: %d prompt, %d cached, %d decoded, %.1f ms",
                    request_id,
                    tally.prompt,
                    tally.cached,
                    sum(tally.per_sample.values()),
                    (time.perf_counter() - t0) * 1e3,
                )

    async def generate_ids(
        self, ids: list[int], params: GenParams, request_id: str, drafts: Sequence[Sequence[int]] | None = None
    ) -> AsyncIterator[Chunk]:
        room = self.max_model_len - len(ids)
        if room < 1:
            return
        if drafts is not None and self.takes_drafts:
            async with contextlib.aclosing(self._generate_taking(ids, params, room, request_id, drafts)) as outs:
                async for c in outs:
                    yield c
            return
        async with contextlib.aclosing(self._run(ids, self._params(params, room), request_id)) as outs:
            async for out in outs:
                c = out.outputs[0]
                if c.text or c.token_ids or c.finish_reason:
                    yield Chunk(c.text, len(c.token_ids), c.finish_reason)

    async def _generate_taking(
        self, ids: list[int], params: GenParams, room: int, request_id: str, drafts: Sequence[Sequence[int]]
    ) -> AsyncIterator[Chunk]:
        """``generate_ids`` with ``drafts`` as the engine's proposals (``coinfer.cloud.draft_proposer``): one output
        a step, a step's tokens past its first the draft tokens it took, each yielded as a chunk of its own (its
        text as the engine's detokenizer writes it), so that a caller's checks every so many tokens see the same
        text at the same counts as without drafts; the proposals' count (``Chunk.offered``) on the last."""
        extra = {DRAFTS_KEY: [list(d) for d in drafts], KEY_KEY: request_id}
        dec = self.decoder(ids)
        async with contextlib.aclosing(
            self._run(ids, self._params(params, room, every=1, extra_args=extra), request_id)
        ) as outs:
            async for out in outs:
                c = out.outputs[0]
                if not (c.text or c.token_ids or c.finish_reason):
                    continue
                m = c.spec_decode_metrics
                offered = m.num_draft_tokens if m is not None else 0
                pieces = [dec.step(tok) or "" for tok in c.token_ids]
                if len(pieces) < 2 or "".join(pieces) != c.text:  # one token, or the engine cut a stop string
                    yield Chunk(
                        c.text, len(c.token_ids), c.finish_reason, accepted=max(0, len(pieces) - 1), offered=offered
                    )
                    continue
                for i, piece in enumerate(pieces):
                    last = i == len(pieces) - 1
                    yield Chunk(
                        piece,
                        1,
                        c.finish_reason if last else None,
                        accepted=int(not last),
                        offered=offered if last else 0,
                    )

    @property
    def takes_drafts(self) -> bool:
        return self.cfg.draft_speculative_tokens > 0

    async def add_drafts(self, request_id: str, drafts: Sequence[Sequence[int]]) -> None:
        if self._llm is not None and drafts:
            await self._in_every_worker(ADD_DRAFTS, request_id, [list(d) for d in drafts])

    async def drafts_refused(self, request_id: str) -> int:
        if self._llm is None:
            return 0
        # the engine that ran the request counts it (every worker of it alike); the others say 0
        return max((int(c or 0) for c in await self._in_every_worker(DRAFTS_REFUSED, request_id)), default=0)

    async def _in_every_worker(self, method: str, *args) -> list:
        """Worker method ``method`` in every worker of every engine, each worker's result: under data parallelism
        ``AsyncLLM.collective_rpc`` reaches the first engine only, or answers with the first engine's results."""
        core = self._llm.engine_core
        if not hasattr(core, "call_utility_all_async"):  # the engine in this process
            return await self._llm.collective_rpc(method, args=args)
        per_engine = await core.call_utility_all_async("collective_rpc", method, None, args, None)
        return [r for results in per_engine for r in (results or [])]

    # ---- token level (``coinfer.cloud.speculation``) --------------------------------------------------
    speculative = True

    async def top_tokens(self, ids: list[int], start: int, request_id: str) -> tuple[list[int], list[float]]:
        """One prefill with the top-1 token at every position (vLLM's prompt logprobs, 2), reading the prefix
        cache: a row the cache served (vLLM leaves it unwritten) is the one an earlier check computed from the
        same tokens (``coinfer.cloud.checked_rows``); where no check kept it, the prefill is asked again without
        the cache."""
        keys = context_keys(ids)
        for reuse in (True, False):
            ranked, cached = await self._prefill(ids, start, request_id, 2, last=True, reuse=reuse)
            rows: list[TopRow] = []
            for pos in range(start, len(ids) + 1):
                if pos - 1 >= cached:  # position p's row is p - 1's output: computed where p - 1 is past the cache
                    rows.append(top2(ranked(pos)))
                elif (kept := self._checked.get(keys[pos])) is not None:
                    rows.append(kept)
                else:
                    break
            else:
                for pos, row in enumerate(rows, start):
                    self._checked.put(keys[pos], row)
                return [r[0] for r in rows], [r[1] for r in rows]
        raise Unavailable("engine: prompt logprobs missing after a full prefill")

    async def token_rows(self, ids: list[int], start: int, request_id: str, k: int) -> list[Row]:
        """The top ``k`` rows of the positions from ``start`` on: one prefill reading the prefix cache, asked again
        without it where the cache served one of them (a sampled check keeps no rows)."""
        for reuse in (True, False):
            ranked, cached = await self._prefill(ids, start, request_id, k, last=False, reuse=reuse)
            if cached < start:
                return [sampled_row(ranked(pos), ids[pos], k) for pos in range(start, len(ids))]
        raise Unavailable("engine: prompt logprobs missing after a full prefill")

    async def _prefill(
        self, ids: list[int], start: int, request_id: str, k: int, *, last: bool, reuse: bool
    ) -> tuple[Callable[[int], list[tuple[int, int, float]]], int]:
        """One prefill of ``ids`` with vLLM's prompt-logprobs rows (top ``k``), reading the prefix cache where
        ``reuse``: a row by position (``ranked(p)``: (rank, token, logprob) of the token at ``p``, and where
        ``last`` of the one after ``ids`` at ``len(ids)``), and the positions the cache served (their rows
        unwritten). The positions before ``start`` are the prompt and the answer so far: a hit there is the
        common case and costs nothing. The rows come flat (vLLM's ``FlatLogprobs``: a few lists for the whole
        prompt, not a dict of objects per position, which its output handler built for every prompt position
        of every check: ~5% of the cloud process's profile under a word-problem load, though no change in its
        CPU per answer was measured end to end: docs/measurements.md, "Exact split on word problems")."""
        if not 0 < start <= len(ids) < self.max_model_len:
            raise ValueError(f"top_tokens: start {start} out of 1..{len(ids)} (or past the context)")
        # detokenize off: rows the cache covered hold whatever memory vLLM left there, and decoding their
        # "token ids" (negative ones) failed vLLM's output handler for every request in flight
        sp = self._params(
            GenParams(max_tokens=1),
            1,
            prompt_logprobs=k,
            logprobs=k if last else None,
            skip_reading_prefix_cache=not reuse,
            detokenize=False,
            flat_logprobs=True,
        )
        plp, cached, after = None, 0, None
        async for out in self._run(ids, sp, request_id if reuse else f"{request_id}-full"):
            plp = out.prompt_logprobs or plp  # delta outputs: they come with the first one
            cached = max(cached, out.num_cached_tokens or 0)
            if out.outputs and out.outputs[0].logprobs:
                after = out.outputs[0].logprobs
        if plp is None or (last and after is None):
            raise Unavailable("engine returned no prompt logprobs")

        def ranked(pos: int) -> list[tuple[int, int, float]]:
            flat, i = (plp, pos) if pos < len(ids) else (after, 0)
            return [
                (flat.ranks[j], flat.token_ids[j], flat.logprobs[j])
                for j in range(flat.start_indices[i], flat.end_indices[i])
                if flat.ranks[j] is not None
            ]

        return ranked, cached

    async def sample_token(self, ids: list[int], params: GenParams, request_id: str, refused: int | None) -> int | None:
        if len(ids) >= self.max_model_len:
            return None
        bias = {"logit_bias": {refused: REFUSED_BIAS}} if refused is not None else {}
        sp = self._params(dataclasses.replace(params, max_tokens=1, stop=()), 1, delta=False, detokenize=False, **bias)
        last = None
        async for out in self._run(ids, sp, request_id):
            last = out
        toks = list(last.outputs[0].token_ids) if last is not None and last.outputs else []
        return toks[0] if toks else None

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
        # only whole completions are read: their first token and their end sent, nothing between
        every = min(params.max_tokens, room)
        async with contextlib.aclosing(
            self._run(ids, self._params(params, room, every=every, n=n), request_id)
        ) as outs:
            async for out in outs:
                for c in out.outputs:  # streamed with n > 1: the completions that advanced, by index
                    texts[c.index] += c.text
                    tokens[c.index] += len(c.token_ids)
                    if c.finish_reason:
                        yield Chunk(texts[c.index], tokens[c.index], c.finish_reason)

    async def continuation_logprobs(
        self, prompt: str, continuation: str, request_id: str, end: bool = True
    ) -> list[float]:
        ids, start = await self._scored_span(prompt, continuation, end)
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
        """Forget cached prompt prefixes and the rows checks kept of them: a benchmark that sends the same prompts
        under several plans starts each plan cold, so that a later plan does not run on an earlier one's cache."""
        self._checked.clear()
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
