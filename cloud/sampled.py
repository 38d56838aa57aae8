"""Taking draft tokens into a *sampled* generation without changing its distribution (pure: no engine, no I/O).

The test is speculative sampling's with the draft as a point mass: at each position the draft proposes one token
``x``; the target takes it with probability ``p(x)``, its own probability of ``x`` at the request's temperature,
and where it refuses, the target's token there is sampled from ``p`` with ``x`` excluded. Whatever ``x`` is, the
token written is then distributed as ``p``: ``x`` with probability ``p(x)``, any other ``y`` with ``(1 - p(x)) *
p(y) / (1 - p(x)) = p(y)``. So the answer is distributed exactly as the target's own sampling, for any draft chosen
without looking at the target's coins (a greedy draft takes most: its tokens are where ``p`` is largest).
Speculative sampling proper (accept with ``min(1, p(x) / q(x))``, resample from ``max(0, p - q)``) takes more
where the draft samples like the target, but its residual needs both models' whole distributions at the refused
position, which vLLM's API does not return (prompt logprobs give the top k).

``p(x)`` at temperature 1 is the prefill's own logprob of ``x`` (prompt logprobs are normalised over the whole
vocabulary): exact. At another temperature ``T`` it is ``p1(x)^(1/T) / Z`` with ``Z = sum_v p1(v)^(1/T)``, of
which the top k are known and the rest is bounded (``token_prob``); a position whose bound leaves ``p(x)``
uncertain by more than ``max_error`` ends the take, and the target samples from there itself. Using the
midpoint ``p`` of ``[lo, hi]`` moves the written token's distribution by at most ``(hi - lo) / 2`` in total
variation, at that position only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_ERROR = 0.005
"""The most a taken token's probability may be uncertain by (half the bound's width): the written token's
distribution is then within this total variation of the target's own at that position. Temperature 1 is exact
(0)."""


@dataclass(frozen=True)
class Row:
    """The target's prefill at one position: the raw logprob (temperature 1) of the token standing there, and the
    raw logprobs of its top k tokens (that token among them or not: ``own_in_top``)."""

    own: float
    top: tuple[float, ...]
    own_in_top: bool


def _logsumexp(xs: Sequence[float]) -> float:
    m = max(xs, default=-math.inf)
    if m == -math.inf:
        return -math.inf
    return m + math.log(sum(math.exp(x - m) for x in xs))


def token_prob(row: Row, temperature: float, vocab: int = 0) -> tuple[float, float]:
    """``p(x)`` for the token at ``row`` at ``temperature`` (> 0), as ``(estimate, error)``: the true value is
    within ``error`` of the estimate. ``vocab``: the target's vocabulary size (0: unknown; needed only above
    temperature 1, where the tokens outside the top k may hold much of ``Z``)."""
    if temperature == 1.0:
        return math.exp(row.own), 0.0
    a = 1.0 / temperature
    known = list(row.top) + ([] if row.own_in_top else [row.own])
    log_s = _logsumexp([a * lp for lp in known])  # the known part of Z, in log space (a * lp underflows at low T)
    rest = 1.0 - sum(math.exp(lp) for lp in known)  # raw mass outside the known tokens
    p_min = math.exp(min(row.top)) if row.top else 1.0  # no token outside the top k is more likely than its last
    n = vocab - len(known) if vocab > len(known) else 0
    if rest <= 1e-12 or (row.top and n == 0 and vocab):
        lo_tail = hi_tail = 0.0
    elif a > 1:  # p^a <= p * p_min^(a-1): at most rest * p_min^(a-1); at least n * (rest/n)^a (convexity)
        hi_tail = rest * p_min ** (a - 1)
        lo_tail = n * (rest / n) ** a if n else 0.0
    else:  # a < 1: p^a >= p * p_min^(a-1); at most n^(1-a) * rest^a (concavity) and n * p_min^a
        lo_tail = rest * p_min ** (a - 1)
        hi_tail = min(n ** (1 - a) * rest**a, n * p_min**a) if n else math.inf
    own = a * row.own
    hi = math.exp(own - _logaddexp(log_s, lo_tail))
    lo = 0.0 if hi_tail == math.inf else math.exp(own - _logaddexp(log_s, hi_tail))
    return (hi + lo) / 2, (hi - lo) / 2


def _logaddexp(log_s: float, tail: float) -> float:
    """log(exp(log_s) + tail)."""
    return log_s if tail <= 0 else _logsumexp([log_s, math.log(tail)])


@dataclass(frozen=True)
class Take:
    """What a sampled check took: the first ``accepted`` draft tokens, and the token the target refused after them
    (None: none was refused; the take ended at the draft's end or where ``p`` was too uncertain): the target's
    next token is sampled with it excluded."""

    accepted: int
    refused: int | None


def take(
    draft: Sequence[int],
    rows: Sequence[Row],
    temperature: float,
    coin: Callable[[], float],
    vocab: int = 0,
    max_error: float = MAX_ERROR,
) -> Take:
    """Walk ``draft`` (``rows[i]``: the target's prefill where ``draft[i]`` stands), taking each token with its
    probability ``p`` (``coin``: a uniform draw in [0, 1), independent of the draft) until one is refused."""
    for i, (x, row) in enumerate(zip(draft, rows)):
        p, err = token_prob(row, temperature, vocab)
        if err > max_error:
            return Take(i, None)
        if coin() >= p:
            return Take(i, x)
    return Take(min(len(draft), len(rows)), None)
