"""The target-model engine behind a small interface (``TargetEngine``); its implementation on vLLM is
``coinfer.cloud.vllm_engine``.

One engine serves verification scoring (prompt logprobs of a draft), exact checks of a draft's tokens
(``top_tokens``: the target's own argmax at each position, ``coinfer.cloud.speculation``) and generation
(streamed). vLLM batches every request from every session continuously; nothing here serialises requests.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from coinfer.chat import ChatFormat, ChatMessage
from coinfer.cloud.sampled import Row
from coinfer.errors import InvalidArgument, Reason, Unavailable
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


def current_cost() -> CloudCost | None:
    """The ``CloudCost`` the current task counts into (None: nobody is counting)."""
    return _COST.get()


@dataclass(kw_only=True)
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
    accepted: int = 0
    """Of ``tokens``, those taken from a draft the target checked (``coinfer.cloud.speculation``): written
    without a decode step of their own."""
    offered: int = 0
    """Draft tokens the engine checked inside the generation (``takes_drafts``), on its last chunk: accepted or
    not, each a position computed."""


class TokenDecoder(ABC):
    """Text of tokens written after a prompt, one token at a time, as the engine's generations write it."""

    @abstractmethod
    def step(self, token: int) -> str | None:
        """The text ``token`` adds; None while it ends inside a character (its bytes come with a later token)."""


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

    # ---- token level: what exact speculation needs (``coinfer.cloud.speculation``) ------------------
    speculative: bool = False
    """Whether this engine implements the token-level methods below. One that does not generates every
    answer itself: a split session then answers as the cloud plan would, without taking draft tokens."""

    end_id: int | None = None
    """The token the target writes to end its answer (the template's end of turn): a draft that ended by
    itself proposes it after its text."""

    stop_ids: frozenset[int] = frozenset()
    """Tokens that end a generation besides ``end_id`` (the template's turn markers, the model's eos)."""

    async def prompt_ids(self, prompt: str) -> list[int]:
        """The token ids ``generate`` reads ``prompt`` as (tokenized off the loop where long)."""
        raise NotImplementedError

    async def text_ids(self, text: str) -> list[int]:
        """The target's tokens of ``text`` written after a prompt: no special tokens added, and the text of
        one of this model's special tokens tokenized as the text it is (a draft never writes a marker)."""
        raise NotImplementedError

    async def top_tokens(self, ids: list[int], start: int, request_id: str) -> tuple[list[int], list[float]]:
        """The target's argmax token at every position from ``start`` on, given the tokens before it, and its
        lead in nats over the runner-up: one prefill of ``ids`` (prefix-cache hits where the engine has them).
        Returns ``len(ids) - start + 1`` of each: the last is the target's next token after all of ``ids``."""
        raise NotImplementedError

    async def token_rows(self, ids: list[int], start: int, request_id: str, k: int) -> list[Row]:
        """The target's prefill at every position from ``start`` to the end of ``ids``: each token's raw logprob
        (temperature 1) and the top ``k`` logprobs there (``coinfer.cloud.sampled``): one prefill, as
        ``top_tokens``. Returns ``len(ids) - start`` rows."""
        raise NotImplementedError

    async def sample_token(self, ids: list[int], params: GenParams, request_id: str, refused: int | None) -> int | None:
        """One token sampled after ``ids`` with ``params`` (its temperature and seed), ``refused`` excluded (a
        logit bias of -100 nats, over 50 at every temperature the API allows); None where the engine wrote none."""
        raise NotImplementedError

    vocab_size: int = 0
    """The target's vocabulary (its logits' width; 0: unknown): bounds the tokens a prefill's top k leave out."""

    tie_nats: float = 0.0
    """A lead of the argmax over the runner-up below this is a tie the engine's arithmetic may break either way:
    a prefill and a decode step round differently (bfloat16 logits: two tokens 0.06 nats apart, one decode and
    the other prefill; ``coinfer.cloud.speculation`` takes no token there)."""

    def generate_ids(
        self, ids: list[int], params: GenParams, request_id: str, drafts: Sequence[Sequence[int]] | None = None
    ) -> AsyncIterator[Chunk]:
        """``generate`` from token ids: the continuation of exactly these tokens (no re-tokenizing). ``drafts``
        (token ids of what may follow ``ids``; only where ``takes_drafts``): proposals the engine checks inside
        the generation, which writes the same tokens with or without them; ``[]``: none yet, ``add_drafts`` may
        send some (None: a generation that takes none)."""
        raise NotImplementedError

    takes_drafts: bool = False
    """Whether ``generate_ids`` takes ``drafts`` as the engine's own speculative proposals, checked in the live
    request (``coinfer.cloud.draft_proposer``), and ``add_drafts`` sends more to a generation under way."""

    async def add_drafts(self, request_id: str, drafts: Sequence[Sequence[int]]) -> None:
        """More ``drafts`` for generation ``request_id`` under way (``takes_drafts``); no effect after it ends."""
        raise NotImplementedError

    async def drafts_refused(self, request_id: str) -> int:
        """Draft tokens generation ``request_id`` checked and refused (``takes_drafts``), read once: for a
        generation its reader stopped before the last chunk, which carries the engine's own count
        (``Chunk.offered``)."""
        raise NotImplementedError

    def decoder(self, ids: list[int]) -> TokenDecoder:
        """A decoder of the tokens written after ``ids``, as this engine's own generations detokenize them."""
        raise NotImplementedError

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

    recovers: bool = False
    """Whether this engine comes back by itself after it failed (a vLLM server elsewhere that restarts:
    ``coinfer.cloud.remote_engine``): the cloud server then keeps asking its heartbeat and turns SERVING
    when it answers, instead of replacing the engine with a new one."""

    async def health_changed(self) -> None:
        """Returns when this engine has seen its health change (a remote server gone or back), so that the
        heartbeat asks now rather than at its next period. The default: never."""
        await asyncio.Event().wait()

    @abstractmethod
    def stats(self) -> EngineStats: ...

    @property
    @abstractmethod
    def max_model_len(self) -> int: ...

    async def close(self, wait_s: float | None = None) -> None:  # noqa: B027 - optional
        """Stop the engine. ``wait_s``: how long its processes get to exit before they are killed (None: the
        engine's default); a failed engine is closed with 0, nothing in it being worth waiting for."""


def restated(d: Draft, target_tokens: int) -> Draft:
    """Draft ``d`` with its token count and mean logprob in the target's tokens (``target_tokens``: its text,
    and its end of turn unless cut): the draft model's total logprob over them. A draft whose model reported
    no logprob (0) keeps 0; a count of 0 on either side leaves the draft as it came."""
    if target_tokens < 1 or d.num_tokens < 1:
        return d
    mean = d.mean_logprob * d.num_tokens / target_tokens if d.mean_logprob < 0 else d.mean_logprob
    return dataclasses.replace(d, num_tokens=target_tokens, mean_logprob=mean)
