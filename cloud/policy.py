"""Pure scheduling maths: verifier scores, the scheduler's rank, consensus, token budgets, round odds.

No I/O here; everything is a function of numbers and strings (docs/design.md §3.1, §4.4), or of a clock
passed in (``RoundOdds``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

from coinfer.estimator import Decayed, DecayedTable, beta_mean_sd


def mean_logprob(logprobs: Sequence[float]) -> float:
    """Mean token log-probability (-inf for no tokens: nothing to vouch for)."""
    return sum(logprobs) / len(logprobs) if logprobs else -math.inf


def likelihood_score(logprobs: Sequence[float]) -> float:
    """exp(mean token logprob) of a draft under the target: a per-token probability in [0, 1].

    Geometric-mean probability rather than the total, so long and short drafts compare.
    """
    if not logprobs:
        return 0.0
    return math.exp(sum(logprobs) / len(logprobs))


def rank_scores(
    scores: Sequence[float],
    latencies_s: Sequence[float],
    a: float,
    b: float,
    g: float,
    agree: Sequence[float] | None = None,
) -> list[float]:
    """Scheduler score per draft: ``a*score + b*agreement - g*latency`` (docs/design.md §3.1).

    ``agree`` per draft: the share of the session's valid drafts that reached the same
    extracted answer (``answer_agreement``: the seed's support term, what self-consistency
    votes on). Without it, the seed's session-wide ``1 - std(scores)``.
    """
    terms = list(agree) if agree is not None else [agreement(scores)] * len(scores)
    return [a * s + b * ag - g * lat for s, ag, lat in zip(scores, terms, latencies_s)]


def answer_agreement(keys: Sequence[object], support: Sequence[int] | None = None) -> list[float]:
    """Per draft, the (support-weighted) share of drafts whose answer key equals its own; a
    draft with no extractable answer (key None) agrees only with itself."""
    w = list(support) if support is not None else [1] * len(keys)
    total = sum(w) or 1
    tally: dict[object, int] = {}
    for k, n in zip(keys, w):
        if k is not None:
            tally[k] = tally.get(k, 0) + n
    return [(tally[k] if k is not None else n) / total for k, n in zip(keys, w)]


def agreement(scores: Sequence[float]) -> float:
    """1 - std of the verifier's scores across a session's drafts (docs/design.md §3.1: the agreement term)."""
    return 1.0 - (statistics.pstdev(scores) if len(scores) > 1 else 0.0)


def consensus_prefix(drafts: Sequence[Sequence[str]], min_support: int) -> list[str]:
    """Longest step prefix where each step is shared by >= ``min_support`` of the drafts
    that agree on every step before it (docs/design.md §4.4)."""
    prefix: list[str] = []
    alive = [list(d) for d in drafts]
    while True:
        pos = len(prefix)
        counts = Counter(d[pos] for d in alive if len(d) > pos)
        if not counts:
            return prefix
        step, n = counts.most_common(1)[0]
        if n < min_support:
            return prefix
        prefix.append(step)
        alive = [d for d in alive if len(d) > pos and d[pos] == step]


# The seed's two points of the refinement budget (docs/design.md §4.4): a draft the verifier scores
# 0.72 gets 256 tokens of refinement, one it scores 0.95 gets 512; linear between and beyond.
LOW_SCORE, LOW_SCORE_TOKENS = 0.72, 256
HIGH_SCORE, HIGH_SCORE_TOKENS = 0.95, 512
MIN_REFINE_TOKENS = 64
"""The least budget a refinement gets, however low the score: room to write a short answer."""


def refine_max_tokens(best_score: float, cap: int, lo: int = MIN_REFINE_TOKENS) -> int:
    """Latency-aware budget (docs/design.md §4.4): score 0.72 -> 256 tokens, 0.95 -> 512, linear between,
    clamped to [lo, cap]. A confident draft earns a longer refinement."""
    per_score = (HIGH_SCORE_TOKENS - LOW_SCORE_TOKENS) / (HIGH_SCORE - LOW_SCORE)
    tokens = LOW_SCORE_TOKENS + (best_score - LOW_SCORE) * per_score
    return int(max(lo, min(cap, tokens)))


def load_scaled_g(g: float, load: float) -> float:
    """The latency weight rises with load (docs/design.md §3.1): at full load latency counts twice as much."""
    return g * (1.0 + min(1.0, max(0.0, load)))


MIN_FIT_ROWS = 8
"""Fewer outcomes than this cannot separate three weights and an intercept (4 unknowns) from noise."""


def fit_weights(
    rows: Sequence[tuple[float, float, float, float]], total: float, ridge: float = 1e-2
) -> tuple[float, float, float] | None:
    """Least-squares fit of ``label ~ a*score + b*agreement - g*latency + c`` over outcome rows
    ``(score, agreement, latency_s, label)``; ridge-regularised, a, b, g clipped at 0 and
    rescaled to sum to ``total`` (ranks are invariant to a positive scale, so the sum is free
    and pinning it keeps the EWMA between fits meaningful). None when the outcomes cannot
    tell the terms apart: fewer than ``MIN_FIT_ROWS`` rows, one label only, or every coefficient <= 0."""
    import numpy as np

    if len(rows) < MIN_FIT_ROWS:
        return None
    arr = np.asarray(rows, dtype=np.float64)
    y = arr[:, 3]
    if y.min() == y.max():
        return None
    x = np.column_stack([arr[:, 0], arr[:, 1], -arr[:, 2], np.ones(len(arr))])
    mu, sd = x[:, :3].mean(0), x[:, :3].std(0)
    sd[sd == 0] = 1.0
    xs = x.copy()
    xs[:, :3] = (x[:, :3] - mu) / sd  # standardise so one ridge fits all three terms
    coef = np.linalg.solve(xs.T @ xs + ridge * np.eye(4), xs.T @ y)[:3] / sd
    coef = np.clip(coef, 0.0, None)
    if coef.sum() <= 0:
        return None
    a, b, g = (coef / coef.sum() * total).tolist()
    return a, b, g


def retry(kind: object) -> tuple:
    """What a retry round of ``kind`` is counted by, apart from its first rounds. A retry follows a round of
    the same request that held no valid draft, so its odds are that request's, not the kind's. On the demo
    words problems (16, three passes) first rounds held a valid draft 4-10 times in 16; the retries after a
    failed one about 1 time in 6, each costing the user a drafting round: 0.65-1.3 s answers with two
    retries against 0.3-0.47 s with none. Counted together, the retries' misses and hits blurred both."""
    return ("retry", kind)


ODDS_TAU_S = 1800.0
"""Seconds in which a round's weight in ``RoundOdds`` falls to 1/e. The key names the draft model, so a new
draft model starts afresh; what remains to drift is the mix of problems within a kind. A kind holds at most
(its sessions a second) x tau rounds of evidence, and about a dozen straight misses make it hopeless: a kind
seen less than every ~2 minutes is never hedged. A hedged kind is waited for again about once per
(a dozen / tau), every ~2.5 minutes, to keep its odds measured. Status: to be measured (docs/planner.md)."""
ODDS_Z = 2.0
"""How many standard deviations above its posterior mean a kind's odds are taken at (``RoundOdds.upper``):
the cloud refuses a round, or hedges, only where even that optimistic bound is below the policy's floor.
About 98% one-sided under the normal approximation of the Beta posterior; status: to be measured."""
MAX_KINDS = 1024
"""Kinds ``RoundOdds`` remembers, least recently used dropped first. A kind is (draft model, task preset, the
rules' kinds) for first rounds and retry rounds: a few draft models x 4 presets x a few rule sets x 2 is tens;
an edge inventing draft model names costs at most this many entries (~200 bytes each)."""


class RoundOdds:
    """How often a round of drafts held a draft the rules pass, per kind of request (``rounds.request_kind``):
    the cloud advises another round only where rounds pay (``PolicyConfig.min_round_odds``), and begins its
    own answer at open where they are hopeless (``PolicyConfig.hedge_below_odds``, ``coinfer.cloud.hedge``).
    A retry round costs the edge a drafting round and the user its wait; the demo draft's held-out select
    drafts failed the exact checkers 16 times in 16 (3 rounds a request), and the cloud answered alone after
    each.

    One decayed estimate per kind (``coinfer.estimator``, ``ODDS_TAU_S``), read as a Beta posterior from a
    uniform prior; a kind is judged by the upper bound of its odds (``upper``: ``ODDS_Z`` standard deviations
    above the mean). A kind seen a few times has a wide posterior, so its rounds are waited for; one that
    misses again and again gets a bound below the floor; a kind refused or hedged is no longer counted, its
    evidence fades, its bound rises, and its rounds are waited for and counted again: the exploration is the
    estimate's own uncertainty, with nothing counted besides. At most ``MAX_KINDS`` kinds are kept."""

    def __init__(
        self,
        *,
        tau_s: float = ODDS_TAU_S,
        z: float = ODDS_Z,
        max_kinds: int = MAX_KINDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.z = z
        self._table: DecayedTable[Hashable] = DecayedTable(tau_s=tau_s, clock=clock, max_keys=max_kinds)

    def __len__(self) -> int:
        """Kinds remembered (at most ``max_kinds``)."""
        return len(self._table)

    def observe(self, kind: Hashable, hit: bool) -> None:
        self._table.add(kind, 1.0 if hit else 0.0)

    def _posterior(self, kind: Hashable) -> tuple[float, float]:
        return beta_mean_sd(*(self._table.get(kind) or Decayed()).beta)

    def odds(self, kind: Hashable) -> float:
        """The posterior mean of the kind's odds (1/2 for a kind never seen: Laplace's rule)."""
        return self._posterior(kind)[0]

    def upper(self, kind: Hashable) -> float:
        """The kind's odds taken optimistically: the posterior mean plus ``z`` standard deviations."""
        mean, sd = self._posterior(kind)
        return mean + self.z * sd

    def pays(self, kind: Hashable, min_odds: float) -> bool:
        """Whether another round is worth asking for (``min_odds`` <= 0: always): neither the kind's first
        rounds nor its retry rounds (``retry``) have odds whose upper bound is below ``min_odds``."""
        return min_odds <= 0 or (self.upper(kind) >= min_odds and self.upper(retry(kind)) >= min_odds)

    def rare(self, kind: Hashable, below: float) -> bool:
        """Whether rounds of ``kind`` hold a valid draft less often than ``below`` even by the upper bound of
        their odds (``below`` <= 0: never): too rarely to ask for another round, or to wait for the first (the
        cloud then begins its own answer at open: ``coinfer.cloud.hedge``). A hedged session's round is not
        counted (a hedge that wins ends the session first), so the kind's evidence fades until its bound
        reaches ``below`` and its rounds are waited for again: a kind whose first rounds missed by chance is not
        hedged for good (the demo's word problems, valid in 4-10 first rounds of 16, were hedged in 23-29 of 30
        sessions by counting rules before)."""
        return below > 0 and self.upper(kind) < below
