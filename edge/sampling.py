"""Pure sampling functions for batched drafting (numpy, no I/O).

Shapes: ``logits`` is [N, V] for N drafts over a vocabulary of V; ``counts`` is
[N, V] token counts of what each draft generated so far (penalties look only at
generated tokens, as in OpenAI's API and vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coinfer.errors import require
from coinfer.types import SamplingParams


@dataclass(frozen=True)
class Sampling(SamplingParams):
    """Draft sampling: the shared sampling parameters (stop strings included) plus the draft count.

    Defaults from seed 003, 4.2: n=5, temperature 0.3, top_p 0.95, presence 0.2,
    frequency 0.1, 256 new tokens. Draft i uses ``seed + i``, so a batch equals
    per-draft runs with those seeds.
    """

    n: int = 5
    """Drafts per round (1..max_drafts)."""

    def validate(self, field: str = "sampling", max_drafts: int = 16, max_new_tokens: int = 1024) -> None:
        super().validate(field, max_new_tokens)
        require(1 <= self.n <= max_drafts, f"{field}.n", f"must be in 1..{max_drafts}, got {self.n}")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def apply_penalties(logits: np.ndarray, counts: np.ndarray, presence: float, frequency: float) -> np.ndarray:
    """logits - presence * [count > 0] - frequency * count."""
    if presence == 0.0 and frequency == 0.0:
        return logits
    return logits - presence * (counts > 0) - frequency * counts


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero out the tail outside the smallest set whose mass reaches ``top_p``; renormalise."""
    if top_p >= 1.0:
        return probs
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    cum = np.cumsum(sorted_p, axis=-1)
    keep_sorted = (cum - sorted_p) < top_p  # keep a token if the mass before it is < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    out = np.where(keep, probs, 0.0)
    return out / out.sum(axis=-1, keepdims=True)


def sample_next(logits: np.ndarray, counts: np.ndarray, s: Sampling,
                rngs: list[np.random.Generator]) -> tuple[np.ndarray, np.ndarray]:
    """One token per row. Returns (tokens [N], logprobs [N] under the unpenalised model)."""
    logits = logits.astype(np.float64)
    base_lp = log_softmax(logits)
    adj = apply_penalties(logits, counts, s.presence_penalty, s.frequency_penalty)
    if s.temperature == 0.0:
        tokens = adj.argmax(axis=-1)
    else:
        probs = np.exp(log_softmax(adj / s.temperature))
        probs = top_p_filter(probs, s.top_p)
        # one generator per draft: row i's choice never depends on the other rows. Inverse-CDF
        # with one uniform per row, vectorised: rng.choice(p=...) per row re-validates and
        # re-sums p each call and was most of a tiny model's per-draft step cost.
        u = np.array([rng.random() for rng in rngs])[:, None]
        cdf = np.cumsum(probs, axis=-1)
        tokens = np.minimum((cdf < u * cdf[:, -1:]).sum(axis=-1), probs.shape[1] - 1)
    return tokens, base_lp[np.arange(len(tokens)), tokens]
