"""Batched drafting on ONNX Runtime: N drafts of one prompt as one batch.

The prompt is prefilled once at batch 1 and its KV cache tiled N times, then
all live drafts decode together (decode is memory-bound: reading the weights
once per step for N rows costs little more than for one). A draft that stops
(EOS, a stop string or its token budget) is handed to ``on_draft`` at once and
its row is dropped from the batch, so later steps only pay for live drafts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from coinfer.chat import ChatFormat, ChatMessage
from coinfer.edge.onnx_lm import OnnxLM, Past
from coinfer.edge.sampling import Sampling, sample_next
from coinfer.errors import ResourceExhausted
from coinfer.manifest import identity, verify_manifest

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class DraftResult:
    """One finished draft."""

    index: int
    text: str
    token_ids: list[int]
    mean_logprob: float
    edge_ms: float
    finish_reason: str  # "stop" (EOS or stop string) or "length"

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class OrtDraftEngine:
    """A draft model directory (``model.onnx`` + tokenizer) on ONNX Runtime."""

    def __init__(
        self,
        model_dir: Path,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        model_file: str = "model.onnx",
        allow_unverified: bool = False,
        io_binding: bool | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        # refuse a tampered, truncated or mismatched artefact before ORT parses any of it
        # (reading every file: from disk when the page cache is cold)
        self.manifest = verify_manifest(self.model_dir, allow_unverified)
        self.identity = identity(self.model_dir, self.manifest)
        """What the cloud knows this draft model by (``OpenRequest.draft_model``): a digest, never a path."""
        t0 = time.perf_counter()
        self.lm = OnnxLM(self.model_dir / model_file, providers, threads, io_binding=io_binding)
        self.session_ms = (time.perf_counter() - t0) * 1e3
        """Session creation alone (the model bytes are in the page cache by then)."""
        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self.chat = ChatFormat.from_dir(self.model_dir)
        cfg = json.loads((self.model_dir / "config.json").read_text())
        self.eos_ids = set(cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]])
        # sliding windows (Mistral, Phi-3, Gemma 2) are masked in the exported graph: the whole context holds
        self.max_positions = int(cfg.get("max_position_embeddings", 2048))
        self.vocab_size = int(cfg["vocab_size"])
        self.runs = 0
        """Requests drafted since warm-up (the planner's first-run term applies while 0)."""

    @property
    def providers(self) -> list[str]:
        return self.lm.providers

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """A conversation as this model reads it (its own chat template, or the plain format)."""
        return self.chat.render(messages)

    def encode(self, text: str) -> list[int]:
        # a chat template writes BOS itself; plain text gets it from the post-processor
        return self.tokenizer.encode(text, add_special_tokens=not self.chat.templated).ids

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def warm_up(self, n: int = Sampling.n, steps: int = 4) -> float:
        """Run a short batch of ``n`` drafts so that the first real request does not pay for lazy
        init: ORT sizes its memory arena and thread pool on the first run of a shape, which one
        token at batch 1 does not cover (measured: a fresh session's first batch-5 request took
        up to 2x a warm one)."""
        t0 = time.perf_counter()
        self.generate(
            self.render([ChatMessage("user", "warm up")]), Sampling(n=n, temperature=0.0, max_new_tokens=steps)
        )
        self.runs = 0
        return (time.perf_counter() - t0) * 1e3

    def _result(self, i: int, ids: list[int], lp: list[float], stops: list[str], t0: float, reason: str) -> DraftResult:
        """Draft ``i`` as text (end-of-turn tokens dropped, cut before the first stop string)."""
        text = self.tokenizer.decode([t for t in ids if t not in self.eos_ids], skip_special_tokens=True)
        for stop in stops:
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]
        return DraftResult(
            index=i,
            text=text,
            token_ids=ids,
            mean_logprob=float(np.mean(lp)) if lp else 0.0,
            edge_ms=(time.perf_counter() - t0) * 1e3,
            finish_reason=reason,
        )

    @staticmethod
    def _next(logits, live: list[int], tokens: list[list[int]], s: Sampling, rngs, greedy: int):
        """One token per live row (``sample_next``), rows of drafts below ``greedy`` by argmax, unpenalised."""
        if not greedy or all(i >= greedy for i in live):
            return sample_next(logits, [tokens[i] for i in live], s, [rngs[i] for i in live])
        argmax = dataclasses.replace(s, temperature=0.0, presence_penalty=0.0, frequency_penalty=0.0)
        nxt, lp = np.empty(len(live), np.int64), np.empty(len(live), np.float64)
        for rows, params in (
            ([r for r, i in enumerate(live) if i < greedy], argmax),
            ([r for r, i in enumerate(live) if i >= greedy], s),
        ):
            if rows:
                n, p = sample_next(logits[rows], [tokens[live[r]] for r in rows], params, [rngs[live[r]] for r in rows])
                nxt[rows], lp[rows] = n, p
        return nxt, lp

    def _prefill(self, prompt: str, max_new_tokens: int, n: int) -> tuple[np.ndarray, Past, int]:
        """The prompt prefilled once at batch 1, its logits and KV cache tiled for ``n`` drafts, and the
        drafts' token budget (what the context leaves of ``max_new_tokens``)."""
        prompt_ids = self.encode(prompt)
        budget = min(max_new_tokens, self.max_positions - len(prompt_ids))
        if budget < 1:
            raise ResourceExhausted(
                f"prompt: {len(prompt_ids)} tokens leave no room in the draft model's "
                f"{self.max_positions}-token context"
            )
        logits, past = self.lm.step(np.array([prompt_ids], np.int64), self.lm.empty_past(len(prompt_ids) + budget))
        return np.repeat(logits, n, axis=0), self.lm.tile(past, n), budget

    def _stopped(self, tok: int, ids: list[int], stops: Sequence[str]) -> bool:
        """Whether a draft whose tokens are ``ids`` (``tok`` the last) ends here: end of turn, or a stop string
        in its last 16 tokens."""
        return tok in self.eos_ids or any(st in self.tokenizer.decode(ids[-16:]) for st in stops)

    def generate(
        self,
        prompt: str,
        s: Sampling,
        on_draft: Callable[[DraftResult], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        greedy: int = 0,
        greedy_tokens: int = 0,
    ) -> list[DraftResult]:
        """Write ``s.n`` drafts for ``prompt``: model input text (``render`` of a conversation).
        ``cancelled()`` true stops drafting (the request's deadline, or its consumer gone): the drafts
        still being written are finished there as "length" (truncated), not dropped. The first ``greedy``
        drafts are written greedily and unpenalised (the draft model's argmax: what an exact check of a
        greedy answer takes most of), the others with ``s``; ``greedy_tokens`` (0: ``s``'s budget) ends those
        greedy drafts sooner, so that they reach the cloud's check while the others are still being written."""
        t0 = time.perf_counter()
        n = s.n
        logits, past, budget = self._prefill(prompt, s.max_new_tokens, n)
        seeds = [None if s.seed is None else s.seed + i for i in range(n)]
        rngs = [np.random.default_rng(sd) for sd in seeds]
        live = list(range(n))  # draft index of each batch row
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        results: list[DraftResult | None] = [None] * n

        def finish(i: int, reason: str) -> None:
            results[i] = r = self._result(i, tokens[i], logprobs[i], s.stop, t0, reason)
            if on_draft is not None:
                on_draft(r)

        for step in range(budget):
            if cancelled is not None and cancelled():
                for i in live:
                    finish(i, "length")
                break
            nxt, lp = self._next(logits, live, tokens, s, rngs, greedy)
            keep: list[int] = []
            for row, i in enumerate(live):
                tok = int(nxt[row])
                tokens[i].append(tok)
                logprobs[i].append(float(lp[row]))
                stopped = self._stopped(tok, tokens[i], s.stop)
                short = i < greedy and 0 < greedy_tokens == step + 1
                if stopped or step == budget - 1 or short:
                    finish(i, "stop" if stopped else "length")
                else:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(live):  # a draft finished: its row leaves the batch (no copy otherwise)
                past = self.lm.select(past, np.array(keep))
            live = [live[r] for r in keep]
            ids = np.array([[tokens[i][-1]] for i in live], np.int64)
            logits, past = self.lm.step(ids, past)
        self.runs += 1
        return [r for r in results if r is not None]
