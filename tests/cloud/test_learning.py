"""Online learning of the scheduler weights: the fit, the EWMA, persistence across restarts, the refit and the
shared file off the event loop."""

import asyncio
import json
import random

from coinfer.cloud.engine import EngineStats
from coinfer.cloud.learning import WeightLearner
from coinfer.cloud.policy import fit_weights, load_scaled_g


def rows_where(label_of, n=200, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s, agree, lat = rng.random(), rng.uniform(0.6, 1.0), rng.uniform(0.0, 0.5)
        out.append((s, agree, lat, float(label_of(s, agree, lat, rng))))
    return out


def test_fit_puts_weight_on_the_term_that_predicts_outcomes():
    by_score = fit_weights(rows_where(lambda s, a, lat, r: s > 0.5), total=1.32)
    assert by_score is not None and abs(sum(by_score) - 1.32) < 1e-9
    a, b, g = by_score
    assert a > 5 * max(b, g)
    a, b, g = fit_weights(rows_where(lambda s, a_, lat, r: lat < 0.2), total=1.0)
    assert g > 5 * max(a, b)  # slow drafts were the wrong ones: latency weight learned


def test_fit_refuses_what_outcomes_cannot_tell():
    assert fit_weights(rows_where(lambda *x: 1), total=1.0) is None  # one label only
    assert fit_weights(rows_where(lambda s, *x: s > 0.5)[:5], total=1.0) is None  # too few rows


def test_learner_updates_every_n_sessions_and_persists(tmp_path):
    path = tmp_path / "state" / "weights.json"
    learner = WeightLearner.open(1.0, 0.3, 0.02, every=10, alpha=0.5, path=str(path))
    rows = rows_where(lambda s, a, lat, r: s > 0.5, n=100)
    for i in range(9):
        assert learner.record(rows[i * 10 : (i + 1) * 10]) is False
    assert not path.exists()
    assert learner.record(rows[90:]) is True  # an update is due: the caller runs it (off the loop)
    asyncio.run(learner.update())
    w = learner.weights
    assert w.updates == 1 and w.sessions == 10 and w.a > 1.0 and w.b < 0.3  # moved halfway to the fit
    saved = json.loads(path.read_text())["weights"]
    again = WeightLearner.open(1.0, 0.3, 0.02, every=10, alpha=0.5, path=str(path))
    assert again.weights.a == saved["a"] and again.weights.updates == 1 and again.weights.sessions == 10


def test_corrupt_state_falls_back_to_configured_weights(tmp_path):
    path = tmp_path / "w.json"
    path.write_text("{not json")
    learner = WeightLearner.open(1.0, 0.3, 0.02, every=10, alpha=0.5, path=str(path))
    assert (learner.weights.a, learner.weights.b, learner.weights.g) == (1.0, 0.3, 0.02)


def test_load_combines_slots_queue_and_kv_cache():
    assert EngineStats(0, 64, True).load == 0.0
    assert EngineStats(32, 64, True).load == 0.5
    assert EngineStats(60, 64, True, waiting=40).load == 1.0
    assert EngineStats(1, 64, True, kv_cache_usage=0.9).load == 0.9
    assert load_scaled_g(0.02, 0.0) == 0.02 and load_scaled_g(0.02, 1.0) == 0.04 and load_scaled_g(0.02, 7) == 0.04


def test_replicas_sharing_one_state_file_lose_no_update(tmp_path):
    """Two replicas on one state file: each update merges into the file's current weights under a lock,
    so every fit counts once and the session counts add up (no replica overwrites the other's)."""
    import json

    from coinfer.cloud.learning import WeightLearner

    path = tmp_path / "state.json"
    a = WeightLearner.open(0.4, 0.3, 0.3, every=2, alpha=0.5, path=str(path))
    b = WeightLearner.open(0.4, 0.3, 0.3, every=2, alpha=0.5, path=str(path))
    good = rows_where(lambda s, a_, lat, r: s > 0.5)  # the verifier score predicts the label
    for learner in (a, b, a, b):
        learner.record(good)
        assert learner.record(good)
        asyncio.run(learner.update())
    saved = json.loads(path.read_text())["weights"]
    assert saved["updates"] == 4 and saved["sessions"] == 8
    assert saved["a"] > 0.9  # the merged fits moved the weight onto the score term (one alone: ~0.7)


import pytest  # noqa: E402


@pytest.mark.parametrize(
    "body",
    [
        '{"weights": {"a": "x", "b": 0.3, "g": 0.1}}',
        '{"weights": {"a": 1, "b": 0.3, "g": 0.1, "sessions": "z"}}',
        '{"weights": {"a": NaN, "b": 0.3, "g": 0.1}}',
        '{"values": []}',
        "[]",
        '{"weights": {"a": -1, "b": 0.3, "g": 0.1}}',
    ],
)
def test_a_state_file_of_the_wrong_shape_is_set_aside(tmp_path, body, caplog):
    path = tmp_path / "state.json"
    path.write_text(body)
    learner = WeightLearner.open(0.4, 0.3, 0.3, every=2, alpha=0.5, path=str(path))
    assert (learner.weights.a, learner.weights.b, learner.weights.g) == (0.4, 0.3, 0.3)
    assert not path.exists() and len(list(tmp_path.glob("state.json.invalid-*"))) == 1
    assert any("invalid state file" in r.message for r in caplog.records)
    ok = tmp_path / "ok.json"
    ok.write_text('{"weights": {"a": 1, "b": 0.5, "g": 0.25, "updates": 3, "sessions": 9}}')  # ints are fine
    assert WeightLearner.open(0.4, 0.3, 0.3, every=2, alpha=0.5, path=str(ok)).weights.sessions == 9


def test_outcome_rows_label_drafts_by_the_tasks_grade_else_by_agreement_with_the_answer():
    from coinfer import types as t
    from coinfer.cloud.learning import outcome_rows
    from coinfer.cloud.ranking import Judged
    from coinfer.extract import Extraction
    from coinfer.rules import RuleSet
    from coinfer.tasks import OPEN, TASKS

    def judged(i: int, text: str, rules: RuleSet) -> Judged:
        v = t.Verdict(draft_index=i, valid=True, score=0.8, verify_ms=250.0)
        return Judged(draft=t.Draft(index=i, text=text), verdict=v, parsed=rules.parse(text))

    rules = RuleSet([], OPEN, {}, extraction=Extraction("marker"))  # open: no grade, agreement decides
    ranked = [(judged(0, "Answer: 17", rules), 1.0, 0.5), (judged(1, "Answer: 16", rules), 0.9, 0.5)]
    assert outcome_rows(ranked, "So: Answer: 17", OPEN, {}, rules) == [(0.8, 0.5, 0.25, 1.0), (0.8, 0.5, 0.25, 0.0)]
    arith = TASKS["arith"]  # a task that grades: right or wrong whatever the answer said
    spec = arith.parse_problem("If x=3 and y=5, compute (x+y)^2-x*y.")
    rules = RuleSet([], arith, spec)
    right = judged(0, arith.solve(spec), rules)
    assert [r[3] for r in outcome_rows([(right, 1.0, 1.0)], "answer 48", arith, spec, rules)] == [1.0]


async def test_the_refit_and_the_shared_files_lock_run_off_the_event_loop(tmp_path, monkeypatch):
    """Issue 51: the cloud took the state file's ``flock`` and fitted numpy on the event loop. The lock is held
    until the loop has run something else: on the loop, that never happens. Sessions recorded meanwhile count."""
    import fcntl
    import threading

    order: list[str] = []
    ticked = threading.Event()
    real_flock = fcntl.flock

    def held_flock(f, op):
        order.append("lock")
        ticked.wait(timeout=30)  # a hang guard only: released at once when the loop runs
        order.append("locked")
        real_flock(f, op)

    monkeypatch.setattr(fcntl, "flock", held_flock)
    learner = WeightLearner.open(1.0, 0.3, 0.02, every=1, alpha=0.5, path=str(tmp_path / "w.json"))
    assert learner.record(rows_where(lambda s, a, lat, r: s > 0.5, n=40))
    update = asyncio.create_task(learner.update())
    while "lock" not in order:
        await asyncio.sleep(0.001)
    order.append("the loop ran")
    learner.record(rows_where(lambda s, a, lat, r: s > 0.5, n=4))  # a session ending meanwhile
    ticked.set()
    await update
    assert order == ["lock", "the loop ran", "locked"]
    assert learner.weights.updates == 1 and learner.weights.sessions == 2
    assert json.loads((tmp_path / "w.json").read_text())["weights"]["sessions"] == 1  # the one written then
