"""What the two target engines on vLLM share: the target's own tokenizer and chat template in this process
(``TokenizingEngine``), and vLLM's reading of a request (its temperature floor, its detokenization, its logprob
rows). ``coinfer.cloud.vllm_engine`` runs vLLM in this process, ``coinfer.cloud.remote_engine`` talks to vLLM's
OpenAI server; both send token ids this process tokenized, so the two read a prompt, a draft and a
continuation the same way.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

from coinfer.chat import ChatFormat, ChatMessage
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.engine import Chunk, GenParams, TargetEngine, TokenDecoder, restated
from coinfer.cloud.sampled import Row
from coinfer.cpu import fast_bfloat16
from coinfer.serving.offload import run_sized
from coinfer.types import Draft

OFF_LOOP_CHARS = 4096
"""Texts longer than this are tokenized off the event loop."""

VLLM_MIN_TEMPERATURE = 0.01
"""vLLM raises a temperature in (0, 0.01) to 0.01 (smaller ones overflow) and logs a warning for each
request; a client sending 1e-45 would fill the log. We raise it ourselves, silently."""


def vllm_temperature(t: float) -> float:
    return t if t == 0 or t >= VLLM_MIN_TEMPERATURE else VLLM_MIN_TEMPERATURE


def chat_format(cfg: EngineConfig) -> ChatFormat:
    """How the target reads a conversation: its directory's template, or the file ``cfg.chat_template`` names
    (vLLM's ``--chat-template``: a base model without one, e.g. Gemma 3 270M)."""
    fmt = ChatFormat.from_dir(cfg.model)
    if cfg.chat_template:
        fmt = fmt.with_template(Path(cfg.chat_template).read_text(encoding="utf-8"), f"{cfg.chat_template}")
    return fmt


@functools.lru_cache(maxsize=8)
def special_ids(tok) -> frozenset[int]:
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
    specials = special_ids(tok)
    after = tok(chat.after_answer(), add_special_tokens=False)["input_ids"]
    if after and after[0] in specials:
        end = after[0]
    turns = chat.render([ChatMessage("user", "u"), ChatMessage("assistant", "a"), ChatMessage("user", "v")])
    marks = {i for i in tok(turns, add_special_tokens=False)["input_ids"] if i in specials}
    return end, frozenset((marks | {end}) - {tok.bos_token_id, None})


TIE_NATS = {"bfloat16": 0.25, "float16": 0.06, "float32": 1e-3}
"""Leads of the argmax under which a prefill and a decode step may pick different tokens, by the engine's dtype:
about two units in the last place of a logit of magnitude 10-30 (bfloat16 keeps 8 bits: SmolLM2-135M on this
CPU, 12 prompts x 96 tokens, split 8 at leads of 0 to 0.125 nats; float32: none)."""


def tie_nats(dtype: str) -> float:
    """``TargetEngine.tie_nats`` for a model running in ``dtype`` ("torch.bfloat16" or "bfloat16"; an unknown
    one, "auto" included: bfloat16's, the widest)."""
    return TIE_NATS.get(dtype.removeprefix("torch."), TIE_NATS["bfloat16"])


def exactness_caveat(tie: float) -> str | None:
    """What an operator must know when exact split runs on a target whose near-ties are ``tie`` nats wide
    (``TargetEngine.tie_nats``), None in float32. In bfloat16 or float16 a decode step and a prefill round a
    near-tie differently, and the cloud plan's own greedy text moves with the batch's shape: split's greedy answer
    is then the target's up to those ties, not the cloud plan's word for word (SmolLM2-135M on a CPU with
    bfloat16 instructions, where "auto" takes bfloat16: "molecules in the atmosphere" from split against
    "molecules of air" from the cloud plan, 2026-12-07)."""
    if tie <= TIE_NATS["float32"]:
        return None
    name = next((k for k, v in TIE_NATS.items() if v == tie), "an unknown dtype")
    return (
        f"verifier 'exact' on a {name} target (near-ties {tie:g} nats wide): split's greedy answers equal the "
        "cloud plan's only up to those ties, where a prefill and a decode step round differently; "
        "--engine.dtype float32 (the in-process engine) or the server's --dtype float32 for word-for-word "
        "answers (docs/api.md, 'How close')"
    )


def engine_dtype(dtype: str) -> str:
    """The dtype to hand vLLM for ``EngineConfig.dtype``: as configured, but "auto" on an x86 CPU without bfloat16
    instructions (neither AVX512-BF16 nor AMX) is float32. vLLM's "auto" takes bfloat16 on every x86 CPU, and on
    one without them the demo target decodes 2.7-4.2x slower in bfloat16 than in float32 (docs/measurements.md,
    "The target's dtype on a CPU without bfloat16 instructions"); with them, bfloat16 was 2.4x faster than float32.
    float32 doubles the weights' memory: set ``bfloat16`` to halve it. GPUs and other CPUs: vLLM's choice."""
    if dtype != "auto":
        return dtype
    import platform

    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or platform.machine().lower() not in ("x86_64", "amd64"):
        return dtype
    return dtype if fast_bfloat16() else "float32"


def top2(ranked: list[tuple[int, int, float]]) -> tuple[int, float]:
    """(argmax token, its lead in nats over the runner-up) of one logprobs row given as (rank, token, logprob)
    entries: the actual token and the top 2, each with its rank (the lead is infinite where vLLM reports no
    runner-up: a vocabulary of one)."""
    ranked = sorted(ranked, key=lambda r: r[0])
    top = ranked[0]
    second = next((r for r in ranked if r[0] == 2), None)
    return int(top[1]), (top[2] - second[2]) if second is not None else math.inf


REFUSED_BIAS = -100.0
"""The logit bias that excludes a refused token from a sampled one (OpenAI's and vLLM's bound): at most temperature
2, 50 nats below where it stood, a probability under 2e-22 times what it had."""


def sampled_row(ranked: list[tuple[int, int, float]], own: int, k: int) -> Row:
    """``coinfer.cloud.sampled.Row`` of one prompt-logprobs row given as (rank, token, logprob) entries: the
    token standing there (``own``) and the top ``k`` by rank."""
    mine = next(r for r in ranked if r[1] == own)
    return Row(own=float(mine[2]), top=tuple(float(r[2]) for r in ranked if r[0] <= k), own_in_top=mine[0] <= k)


def model_vocab(model: str, tok) -> int:
    """The target's logits' width: the model's ``vocab_size`` (its config, or its text model's), at least the
    tokenizer's length (a padded embedding is wider than the tokenizer; an over-count only widens the bound it
    is used for)."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    n = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size") or 0
    return max(int(n), len(tok))


class StreamDecoder(TokenDecoder):
    """vLLM's own detokenization of a generation (its ``FastIncrementalDetokenizer``: the tokenizers library's
    ``DecodeStream`` primed with the prompt, special tokens skipped), so that tokens taken from a draft read
    as the same text the engine would have streamed for them."""

    def __init__(self, tok, ids: list[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self._tok = tok.backend_tokenizer
        self._stream = DecodeStream(ids=list(ids), skip_special_tokens=True)

    def step(self, token: int) -> str | None:
        return self._stream.step(self._tok, token)


class TokenizingEngine(TargetEngine):
    """A target engine on vLLM whose texts this process tokenizes with the target's own tokenizer (loaded from
    its model directory by ``load_tokenizer``) and hands to vLLM as token ids. Subclasses implement
    ``generate_ids`` and the requests; ``max_model_len`` is theirs."""

    _tok = None
    end_id: int | None = None
    """The token scored after a finished draft: the template's end of turn (``template_ids``)."""
    stop_ids: frozenset[int] = frozenset()
    """Tokens that end every generation besides the model's eos: the template's turn markers."""
    scores_end = True
    """Whether a finished draft's end of turn is scored. Not for a base model given a template it was never
    trained on (``EngineConfig.chat_template`` over a directory without one): its end-of-turn token says
    nothing of the answer (Gemma 3 270M base: -25 nats after "The capital of France is Paris.", which
    failed every finished draft)."""

    def load_tokenizer(self, cfg: EngineConfig) -> None:
        """The target's tokenizer and chat format from ``cfg.model`` (and ``cfg.chat_template``)."""
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(cfg.model)
        self.vocab_size = model_vocab(cfg.model, self._tok)
        self.chat = chat_format(cfg)
        self._templated()
        self.scores_end = not cfg.chat_template or ChatFormat.from_dir(cfg.model).templated

    @property
    def tokenizer(self):
        """The target's Hugging Face tokenizer."""
        return self._tok

    @staticmethod
    async def _off_loop(chars: int, fn, *args):
        """``fn(*args)``, in a worker thread when it tokenizes over ``OFF_LOOP_CHARS`` characters (the
        tokenizer releases the GIL): ~1 ms per KiB, and a prompt, its drafts and a continuation reach tens
        of KiB (66 ms on the loop was seen)."""
        return await run_sized(chars, fn, *args, limit=OFF_LOOP_CHARS)

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
        if not special_ids(self._tok).isdisjoint(ids[start:]):
            head = self._ids(prompt)
            tail = self._tok(continuation, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            return list(head) + list(tail), len(head)
        return list(ids), start

    async def _scored_span(self, prompt: str, continuation: str, end: bool) -> tuple[list[int], int]:
        """``continuation_logprobs``'s ids (``span_ids``, then the end of turn unless ``end`` is False, within
        the context) and the continuation's first index."""
        ids, start = await self._off_loop(len(prompt) + len(continuation), self.span_ids, prompt, continuation)
        return (ids + [self.end_id] * (end and self.scores_end))[: self.max_model_len - 1], start

    async def _prompt(self, prompt: str) -> tuple[list[int], int]:
        """(token ids of ``prompt``, tokens of context left after it): tokenized off the loop."""
        ids = await self._off_loop(len(prompt), self._ids, prompt)
        return ids, self.max_model_len - len(ids)

    async def generate(self, prompt: str, params: GenParams, request_id: str) -> AsyncIterator[Chunk]:
        ids, _ = await self._prompt(prompt)
        async with contextlib.aclosing(self.generate_ids(ids, params, request_id)) as chunks:
            async for c in chunks:
                yield c

    async def prompt_ids(self, prompt: str) -> list[int]:
        ids, _ = await self._prompt(prompt)
        return ids

    async def text_ids(self, text: str) -> list[int]:
        return await self._off_loop(len(text), self._text_ids, text)

    def _text_ids(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def decoder(self, ids: list[int]) -> TokenDecoder:
        return StreamDecoder(self._tok, ids)
