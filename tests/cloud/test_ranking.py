"""The ranking of valid drafts: score, agreement and latency; finished before truncated; duplicates merged."""

from __future__ import annotations

from coinfer import types as t
from coinfer.cloud.ranking import Judged, rank
from coinfer.extract import Extraction
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN

WEIGHTS = (1.0, 0.3, 0.02)
RULES = RuleSet([], OPEN, {}, extraction=Extraction("marker"))


def _judged(i: int, score: float, text: str = "", *, valid: bool = True, truncated: bool = False, **kw) -> Judged:
    text = text or f"draft {i}"
    d = t.Draft(index=i, text=text, num_tokens=12, mean_logprob=-0.1, edge_ms=1.0, truncated=truncated)
    v = t.Verdict(draft_index=i, valid=valid, score=score, **kw)
    return Judged(draft=d, verdict=v, parsed=RULES.parse(text))


def test_valid_drafts_best_first_and_the_rest_left_out():
    judged = [_judged(0, 0.5), _judged(1, 0.9), _judged(2, 0.99, valid=False), _judged(3, 0.95, duplicate_of=2)]
    ranked = rank(judged, OPEN, WEIGHTS, load=0.0)
    assert [j.draft.index for j, _, _ in ranked] == [1, 0]  # invalid and duplicate drafts are not ranked
    assert ranked[0][1] > ranked[1][1]
    assert rank([_judged(0, 0.5, valid=False)], OPEN, WEIGHTS, load=0.0) == []


def test_a_finished_draft_comes_before_a_truncated_one_of_any_score():
    ranked = rank([_judged(0, 0.99, truncated=True), _judged(1, 0.2)], OPEN, WEIGHTS, load=0.0)
    assert [j.draft.index for j, _, _ in ranked] == [1, 0]


def test_agreement_on_the_extracted_answer_outranks_a_slightly_likelier_lone_answer():
    a, b, c = _judged(0, 0.8, "Answer: 17"), _judged(1, 0.8, "So: Answer: 17"), _judged(2, 0.85, "Answer: 16")
    ranked = rank([a, b, c], OPEN, (1.0, 1.0, 0.0), load=0.0)
    assert ranked[-1][0] is c and ranked[0][2] == 2 / 3 and ranked[-1][2] == 1 / 3


def test_latency_counts_more_under_load():
    slow, fast = _judged(0, 0.90, verify_ms=200.0), _judged(1, 0.88)
    weights = (1.0, 0.3, 0.075)  # 0.2 s of latency: 0.015 idle, twice that at full load; the scores differ by 0.02
    assert rank([slow, fast], OPEN, weights, load=0.0)[0][0] is slow
    assert rank([slow, fast], OPEN, weights, load=1.0)[0][0] is fast
