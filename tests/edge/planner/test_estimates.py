"""Estimates: absurd measurements refused and said, defaults said, decayed means that are never reset,
probe readings, persistence (aged by the downtime; older formats ignored; written off the event loop)."""

import asyncio
import json
import math
import os
import threading

import pytest

from coinfer.edge.planner.estimates import DEFAULTS, TAU_S, Estimates


def test_absurd_measurements_are_refused_and_noted():
    e = Estimates()
    for key, bad in [
        ("up_bps", 0.0),
        ("rtt_ms", -3.0),
        ("disk_read_bps", math.inf),
        ("quality.edge.arith", 1.5),
        ("verify_ms", math.nan),
        ("down_bps", None),
    ]:
        assert e.observe(key, bad) is False
        assert not e.has(key)
    assert len(e.notes) == 6 and "refused absurd" in e.notes[0]
    assert e.get("up_bps") == DEFAULTS["up_bps"] and any("not measured yet" in n for n in e.notes)


def test_a_decayed_mean_per_key_with_family_defaults_and_probe_readings():
    now = [0.0]
    e = Estimates(clock=lambda: now[0])
    e.observe("rtt_ms", 10.0)
    e.observe("rtt_ms", 20.0)
    assert e.get("rtt_ms") == 15.0  # taken together: a plain mean
    now[0] = TAU_S
    e.observe("rtt_ms", 40.0)  # the older two weigh e^-1 each against this one
    w = math.exp(-1)
    assert e.get("rtt_ms") == pytest.approx((w * 30.0 + 40.0) / (2 * w + 1))
    assert e.estimate("rtt_ms").weight == pytest.approx(2 * w + 1) and e.age_s("rtt_ms") == 0.0
    e.observe("rtt_ms", 50.0, replace=True)  # a probe's reading: the conditions now, on purpose
    assert e.get("rtt_ms") == 50.0 and e.estimate("rtt_ms").weight == 1.0
    e.observe("draft_tokens", 30.0)
    assert e.get("draft_tokens.select") == 30.0  # a task never seen uses its family's measurement
    assert e.measured("draft_tokens.select") is None and e.get("decode_steps.split.arith") == 64.0
    assert e.age_s("up_bps") == math.inf


def test_an_outcome_averaged_over_many_requests_is_never_reset_by_its_age():
    """Issue 51: an outcome last measured over ``STALE_AFTER_S`` ago was reset to one sample's weight: a mean of
    hundreds of requests then weighed as one against the next. Here its weight is what its age leaves it."""
    now = [0.0]
    e = Estimates(clock=lambda: now[0])
    for i in range(200):  # 10 a second for 20 s
        now[0] = i / 10
        e.observe("quality.split.words", 0.0 if i % 25 == 0 else 1.0)
    before = e.get("quality.split.words")
    for at in (19.9 + 11.0, 19.9 + 22.0):  # two failures 11 s apart
        now[0] = at
        e.observe("quality.split.words", 0.0)
    assert before == pytest.approx(0.96, abs=0.01) and e.get("quality.split.words") > 0.8  # was 0.46, then 0.23


def test_estimates_persist_aged_by_the_downtime(tmp_path):
    path = tmp_path / "cal" / "planner.json"
    now, wall = [100.0], [1_000.0]
    e = Estimates.open(path, clock=lambda: now[0], wall=lambda: wall[0])
    for v in (10.0, 20.0, 30.0):
        e.observe("latency_ms.split.arith", v)
    now[0] += 5.0  # 5 s after the last sample: saved
    e.save()  # no event loop here: written at once
    assert json.loads(path.read_text())["version"] == 2
    wall[0] += 2 * TAU_S  # down for 2 tau, then started on a fresh monotonic clock
    again = Estimates.open(path, clock=lambda: 7.0, wall=lambda: wall[0])
    d = again.estimate("latency_ms.split.arith")
    assert d.mean == 20.0 and d.weight == pytest.approx(3 * math.exp(-(5.0 + 2 * TAU_S) / TAU_S))
    assert d.variance == pytest.approx(100.0)  # the spread survives; only the evidence fades
    assert again.age_s("latency_ms.split.arith") == pytest.approx(5.0 + 2 * TAU_S)


def test_a_file_of_the_format_before_is_ignored_with_a_note_not_set_aside(tmp_path, caplog):
    path = tmp_path / "planner.json"
    path.write_text(json.dumps({"values": {"rtt_ms": 12.0}, "updated": {"rtt_ms": 1.0}, "counts": {"rtt_ms": 3}}))
    with caplog.at_level("INFO"):
        e = Estimates.open(path)
    assert not e.has("rtt_ms") and path.exists() and not list(tmp_path.glob("planner.json.invalid-*"))
    assert any("older format" in n for n in e.notes) and "older format" in caplog.text
    bad = {
        "version": 2,
        "saved_at": 0.0,
        "estimates": {"rtt_ms": {"mean": -1, "weight": 1, "sq_weight": 1, "m2": 0, "age_s": 0}},
    }
    path.write_text(json.dumps(bad))
    assert not Estimates.open(path).has("rtt_ms")  # a saved value out of bounds is refused, the rest loads


@pytest.mark.parametrize(
    "body", ['{"values": []}', '{"values": {"rtt_ms": "x"}}', '{"values": {"rtt_ms": NaN}}', "[1, 2]", "not json", ""]
)
def test_a_calibration_file_of_the_wrong_shape_is_set_aside(tmp_path, body):
    path = tmp_path / "est.json"
    path.write_text(body)
    est = Estimates.open(path)  # never raises: the edge starts from defaults
    assert not est.means() and not path.exists() and len(list(tmp_path.glob("est.json.invalid-*"))) == 1
    assert any("set aside" in n for n in est.notes)


def test_caveats_do_not_grow():
    e = Estimates()
    for v in (-1.0, -2.0, -3.0):
        e.observe("rtt_ms", v)
    assert sum("rtt_ms: refused" in n for n in e.notes) == 1 and "-3.0" in e.notes[-1]
    assert e.observe("bytes_per_token", 0.0) is False  # prompt_size divides by it


async def test_saving_from_the_event_loop_writes_in_a_worker_thread(tmp_path, monkeypatch):
    """Issue 51: the edge wrote its estimates file on the event loop after every request it learnt from. The
    write is held until the loop has run something else: on the loop, that never happens."""
    order: list[str] = []
    ticked = threading.Event()
    real_replace = os.replace

    def held_replace(src, dst):
        order.append("write")
        ticked.wait(timeout=30)  # a hang guard only: released at once when the loop runs
        order.append("written")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", held_replace)
    e = Estimates.open(tmp_path / "planner.json")
    e.observe("rtt_ms", 12.0)
    e.save()
    while "write" not in order:
        await asyncio.sleep(0.001)
    order.append("tick")
    e.observe("rtt_ms", 14.0)
    e.save()  # while the first is under way: written after it
    e.save()  # ... together with this one
    ticked.set()
    await e.flush()
    assert order[:3] == ["write", "tick", "written"] and order.count("write") == 2
    assert Estimates.open(tmp_path / "planner.json").get("rtt_ms") == pytest.approx(13.0, abs=0.01)
