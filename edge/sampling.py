"""Pure sampling functions for batched drafting (numpy, no I/O).

Shapes: ``logits`` is [N, V] for N drafts over a vocabulary of V; ``history`` holds, per
row, the token ids that draft generated so far (penalties look only at generated tokens, as
in OpenAI's API and vLLM, and touch only those: sparse, not a dense [N, V] count table).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coinfer.errors import require
from coinfer.types import SamplingParams

DEFAULT_DRAFTS = 5
"""Drafts per round until the cloud recommends a count (docs/design.md §4.2's n; the cloud's own
recommendation, §3.3, is 5 at moderate load, so a fresh edge asks what a loaded-but-healthy cloud would)."""
DEFAULT_MAX_DRAFTS = 16
"""Drafts per round a request may ask for, unless the daemon sets its own (``EdgeConfig.max_drafts``)."""
DEFAULT_MAX_NEW_TOKENS = 1024
"""New tokens per draft or answer a request may ask for, unless the daemon sets its own
(``EdgeConfig.max_new_tokens``, at most ``coinfer.validate.MAX_NEW_TOKENS``)."""


@dataclass(kw_only=True, frozen=True)
class Sampling(SamplingParams):
    """Draft sampling: the shared sampling parameters (stop strings included) plus the draft count.

    Defaults from docs/design.md §4.2: n=5, temperature 0.3, top_p 0.95, presence 0.2,
    frequency 0.1, 256 new tokens. Draft i uses ``seed + i``, so a batch equals
    per-draft runs with those seeds.
    """

    n: int = DEFAULT_DRAFTS
    """Drafts per round (1..max_drafts)."""

    def validate(
        self,
        field: str = "sampling",
        max_drafts: int = DEFAULT_MAX_DRAFTS,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ) -> None:
        super().validate(field, max_new_tokens)
        require(1 <= self.n <= max_drafts, f"{field}.n", f"must be in 1..{max_drafts}, got {self.n}")


PRUNE_NATS = 12.0
"""Sampling prunes before it normalises: a token whose tempered logit is more than this below the
row's best (probability ratio e^-12 = 6e-6) is never drawn -- finding the rest is one comparison
over the vocabulary, where normalising or sorting the whole row is the cost that grows with it."""
MIN_TEMPERATURE = 1e-4
"""Below this a temperature samples as greedy (the best token's lead over the next is tempered past 1e4 nats)."""
MAX_CANDIDATES = 4096
"""A flat row with more survivors than this keeps its top MAX_CANDIDATES (a partial sort)."""


def apply_penalties(logits: np.ndarray, counts: np.ndarray, presence: float, frequency: float) -> np.ndarray:
    """logits - presence * [count > 0] - frequency * count (dense reference of ``penalize``)."""
    if presence == 0.0 and frequency == 0.0:
        return logits
    return logits - presence * (counts > 0) - frequency * counts


def penalize(logits: np.ndarray, history: Sequence[Sequence[int]], presence: float, frequency: float) -> np.ndarray:
    """``apply_penalties`` touching only the tokens each row generated: O(generated), not O(V)."""
    if presence == 0.0 and frequency == 0.0:
        return logits
    out = logits.copy()
    for r, ids in enumerate(history):
        if len(ids):
            toks, cnt = np.unique(np.asarray(ids, np.int64), return_counts=True)
            out[r, toks] -= (presence + frequency * cnt).astype(out.dtype)
    return out


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero out the tail outside the smallest set whose mass reaches ``top_p``; renormalise
    (full-sort reference of the nucleus ``sample_next`` cuts)."""
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


def nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest set of ``p`` (normalised probabilities) whose mass reaches ``top_p``,
    ascending: a token is kept while the mass before it is < top_p (as ``top_p_filter``)."""
    if top_p >= 1.0:
        return np.arange(len(p))
    order = np.argsort(-p, kind="stable")
    sp = p[order]
    before = np.cumsum(sp) - sp
    return np.sort(order[before < top_p])


def _candidates(raw: np.ndarray, floor: float) -> np.ndarray:
    """Ids of ``raw`` at or above ``floor`` (one comparison pass); the top MAX_CANDIDATES of a flat row."""
    cand = np.flatnonzero(raw >= floor)
    if len(cand) > MAX_CANDIDATES:
        cand = cand[np.argpartition(raw[cand], len(cand) - MAX_CANDIDATES)[len(cand) - MAX_CANDIDATES :]]
    return cand


def log_normalizer(logits: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Per-row log-sum-exp of float32 ``logits`` [N, V] with row maxima ``m``: two passes (exp, sum)
    where logits sit within float32's exp range, so no shifted copy is needed (e^+-80 neither
    overflows nor loses the largest term); three otherwise."""
    work = np.empty_like(logits)
    if float(np.abs(m).max(initial=0.0)) < 80.0:
        np.exp(logits, out=work)
        return np.log(work.sum(axis=-1).astype(np.float64))
    np.subtract(logits, m[:, None], out=work)
    np.exp(work, out=work)
    return m.astype(np.float64) + np.log(work.sum(axis=-1).astype(np.float64))


def sample_next(
    logits: np.ndarray, history: Sequence[Sequence[int]], s: Sampling, rngs: list[np.random.Generator]
) -> tuple[np.ndarray, np.ndarray]:
    """One token per row; ``history`` holds each row's generated ids (the penalties' counts).
    Returns (tokens [N], logprobs [N] under the unpenalised model).

    float32 over the vocabulary, which is read four times per row: its max, exp and sum (the
    log-sum-exp of the reported logprob, exact) and one comparison that keeps the tokens within
    PRUNE_NATS of the best once tempered and penalised. Penalties, temperature, softmax, the top-p
    nucleus and the draw all run on those few survivors (float64): at a 128k vocabulary 5 rows
    cost under a millisecond per step (benchmarks/sampling_speed.py). Greedy is the penalised argmax."""
    logits = np.asarray(logits, np.float32)
    m = logits.max(axis=-1)
    lse = log_normalizer(logits, m)
    pen = s.presence_penalty != 0.0 or s.frequency_penalty != 0.0
    if 0.0 < s.temperature < MIN_TEMPERATURE:  # logits / 1e-308 overflow; this cold is greedy anyway
        s = dataclasses.replace(s, temperature=0.0)
    temp = s.temperature if s.temperature > 0.0 else 1.0
    tokens = np.empty(len(logits), np.int64)
    for r in range(len(logits)):
        raw = logits[r]
        # a Counter, not np.unique/isin: the history and the survivors are a few hundred ids at most,
        # where numpy's per-call overhead was most of a step (profiled)
        counts = Counter(history[r]) if pen else {}
        # penalties only lower logits: widen the window by the largest one so no survivor is missed
        widest = max(0.0, s.presence_penalty + s.frequency_penalty * max(counts.values())) if counts else 0.0
        window = 0.0 if s.temperature == 0.0 else PRUNE_NATS * temp
        cand = _candidates(raw, float(m[r]) - window - widest)
        vals = raw[cand].astype(np.float64)
        if counts:
            for j, c in enumerate(cand.tolist()):
                if c in counts:
                    vals[j] -= s.presence_penalty + s.frequency_penalty * counts[c]
        if s.temperature == 0.0:
            tokens[r] = cand[int(np.argmax(vals))] if len(cand) else int(raw.argmax())
            continue
        z = vals / temp
        p = np.exp(z - z.max())
        keep = p >= np.exp(-PRUNE_NATS)  # the prune, after the penalties moved the best
        cand, p = cand[keep], p[keep]
        p /= p.sum()
        kept = nucleus(p, s.top_p)
        order = np.argsort(cand[kept])  # draw in id order: the same u picks the same token however found
        ids_k, p_k = cand[kept][order], p[kept][order]
        cdf = np.cumsum(p_k)
        u = rngs[r].random()  # one generator per draft: row r's choice never depends on other rows
        tokens[r] = ids_k[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(ids_k) - 1)]
    rows = np.arange(len(tokens))
    return tokens, logits[rows, tokens].astype(np.float64) - lse
