"""Pure scheduling maths: verifier scores, the scheduler's rank, consensus, token budgets.

No I/O here; everything is a function of numbers and strings (docs/design.md §3.1, §4.4).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence


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


class RoundOdds:
    """How often a round of drafts held a draft the rules pass, per kind of request (task and rules): the
    cloud advises another round only where rounds pay (``PolicyConfig.min_round_odds``). A retry round costs
    the edge a drafting round and the user its wait; the demo draft's held-out select drafts failed the
    exact checkers 16 times in 16 (3 rounds a request), and the cloud answered alone after each.

    Counts decay by ``decay`` per observation (recent traffic counts most), from a prior of ``prior_hits``
    in ``prior_rounds``; a kind seen in fewer than ``min_rounds`` first rounds, or ``retry_rounds`` retry rounds,
    retries as before (retry rounds come only after a failed round: fewer to wait for, and a wrong refusal
    costs no accuracy, the cloud answering itself). Every ``explore_every``-th refusal retries
    anyway, so that a kind whose drafts improve (a new draft model) is seen to. The same odds say where the
    cloud should not wait for the first round either (``hopeless``)."""

    def __init__(
        self,
        *,
        prior_hits: float = 1.0,
        prior_rounds: float = 2.0,
        decay: float = 0.98,
        explore_every: int = 10,
        min_rounds: int = 20,
        hedge_min_rounds: int = 3,
        retry_rounds: int = 6,
        early_rounds: int = 8,
        early_explore_every: int = 2,
    ) -> None:
        self.prior = (prior_hits, prior_rounds)
        self.decay, self.explore_every, self.min_rounds = decay, explore_every, min_rounds
        self.hedge_min_rounds, self.retry_rounds = hedge_min_rounds, retry_rounds
        self.early_rounds, self.early_explore_every = early_rounds, early_explore_every
        self._counts: dict[object, tuple[float, float]] = {}
        self._seen: dict[object, int] = {}
        self._refused: dict[object, int] = {}
        self._hedged: dict[object, int] = {}

    def observe(self, kind: object, hit: bool) -> None:
        hits, rounds = self._counts.get(kind, self.prior)
        self._counts[kind] = (hits * self.decay + hit, rounds * self.decay + 1)
        self._seen[kind] = self._seen.get(kind, 0) + 1

    def odds(self, kind: object) -> float:
        hits, rounds = self._counts.get(kind, self.prior)
        return hits / rounds

    def below(self, kind: object, floor: float, min_rounds: int) -> bool:
        """Whether rounds of ``kind``, seen at least ``min_rounds`` times, held a valid draft less often
        than ``floor`` lately (``floor`` <= 0: never)."""
        return floor > 0 and self._seen.get(kind, 0) >= min_rounds and self.odds(kind) < floor

    def pays(self, kind: object, min_odds: float) -> bool:
        """Whether another round is worth asking for (``min_odds`` <= 0: always): neither the kind's first
        rounds nor its retry rounds (``retry``) held a valid draft less often than ``min_odds`` lately."""
        first, again = self.below(kind, min_odds, self.min_rounds), self.below(retry(kind), min_odds, self.retry_rounds)
        if not (first or again):
            return True  # off, too few rounds seen to judge (``min_rounds``), or rounds pay
        n = self._refused[kind] = self._refused.get(kind, 0) + 1
        return n % self.explore_every == 0

    def rare(self, kind: object, below: float) -> bool:
        """Whether rounds of ``kind`` held a valid draft less often than ``below`` lately, judged after
        ``hedge_min_rounds`` rounds (``below`` <= 0: never): too rarely to wait for one (``hopeless``) or
        to ask for another."""
        return self.below(kind, below, self.hedge_min_rounds)

    def hopeless(self, kind: object, below: float) -> bool:
        """Whether a round of this kind is so unlikely to hold a valid draft that the cloud should begin its
        own answer at once rather than wait for the round (``coinfer.cloud.hedge``; ``below`` <= 0: never).
        A wrong yes costs only cloud time (a valid draft still wins the race when it comes first), so it
        is said after ``hedge_min_rounds`` rounds, not ``min_rounds``; every ``explore_every``-th yes is
        a no, so that rounds of the kind are still waited for and counted (a hedge that wins ends the
        session before its round closes: nothing is observed). While fewer than ``early_rounds`` rounds
        of the kind were seen, every ``early_explore_every``-th is: a hedge stops the counting it rests
        on, so a kind whose first three rounds missed by chance stayed hedged for good (the demo's word
        problems, whose first rounds hold a valid draft 4-10 times in 16: after ``auto``'s requests split
        answered 23-29 of 30 alone, in one run 1 of 30 from a draft, where a fresh cloud took 12-14 from drafts)."""
        if not self.rare(kind, below):
            return False
        n = self._hedged[kind] = self._hedged.get(kind, 0) + 1
        early = self._seen.get(kind, 0) < self.early_rounds
        return n % (self.early_explore_every if early else self.explore_every) != 0
