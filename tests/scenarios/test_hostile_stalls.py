"""The hostile campaign reads the servers' loop-stall warnings (coinfer.serving.loopwatch) back from their logs:
only those logged while the targets ran count, per target too, and the stacks of stalls where code held
the loop (over 50 ms on CPU) are kept."""

from datetime import datetime

from scenarios.hostile.stalls import parse_stalls, stall_report

LOG = """\
2026-11-30 21:10:02,001 INFO coinfer.cloud.server: serving on 127.0.0.1:40000
2026-11-30 21:10:05,500 WARNING coinfer.loop: event loop held 900 ms (threshold 50 ms), 850 ms of it on CPU; the loop thread was in:
  File "/x/cloud/server.py", line 10, in start
    load_model()
2026-11-30 21:13:15,190 WARNING coinfer.loop: event loop held 63 ms (threshold 50 ms), 7 ms of it on CPU, 50 ms waiting for a core, 4 ms collecting garbage; the loop thread was in:
  (no Python frame was seen: the watchdog did not run either) [3 similar lines suppressed in the last 10 s]
2026-11-30 21:13:16,000 WARNING coinfer.edge.link: cloud slow
2026-11-30 21:13:20,250 WARNING coinfer.loop: event loop held 310 ms (threshold 50 ms), 290 ms of it on CPU; the loop thread was in:
  File "/x/asyncio/events.py", line 84, in _run
    self._context.run(self._callback, *self._args)
  File "/x/edge/service.py", line 227, in parse
    json.loads(body)
(EngineCore pid=7) INFO 11-30 21:13:20 [core.py:12] step
2026-11-30 21:13:21,000 WARNING coinfer.loop: event loop held 120 ms (threshold 50 ms), 110 ms of it on CPU; the loop thread was in:
  File "/x/a.py", line 1, in a
2026-11-30 21:13:22,000 WARNING coinfer.loop: event loop held 90 ms (threshold 50 ms), 60 ms of it on CPU; the loop thread was in:
  File "/x/b.py", line 2, in b
2026-11-30 21:13:23,000 WARNING coinfer.loop: event loop held 80 ms (threshold 50 ms), 70 ms of it on CPU; the loop thread was in:
  File "/x/c.py", line 3, in c
2026-11-30 21:20:00,000 WARNING coinfer.loop: event loop held 5000 ms (threshold 50 ms), 4000 ms of it on CPU; the loop thread was in:
  File "/x/cloud/server.py", line 99, in stop
"""


def at(hms: str) -> float:
    """Wall-clock time of a local time on the log's day (the log writes local time)."""
    return datetime.fromisoformat(f"2026-11-30 {hms}").timestamp()


def test_the_log_is_parsed_with_each_stall_s_stack():
    stalls = parse_stalls(LOG)
    assert [(s.held_ms, s.on_cpu_ms) for s in stalls] == [
        (900, 850),
        (63, 7),
        (310, 290),
        (120, 110),
        (90, 60),
        (80, 70),
        (5000, 4000),
    ]
    assert stalls[0].at == "2026-11-30 21:10:05,500" and stalls[0].t == at("21:10:05.5")
    assert stalls[1].stack.strip().startswith("(no Python frame was seen")
    assert [(s.queued_ms, s.gc_ms) for s in stalls[:3]] == [
        (0, 0),
        (50, 4),
        (0, 0),
    ]  # the split is in newer servers' lines only
    # the stack ends at the next unindented line (here another process' output), not only at a timestamp
    assert stalls[2].stack.splitlines() == LOG.split("loop thread was in:\n")[3].splitlines()[:4]
    assert "EngineCore" not in stalls[2].stack and all(s.threshold_ms == 50 for s in stalls)


def test_only_stalls_while_the_targets_ran_count_per_target_too():
    windows = {"edge.Status": (at("21:13:00"), at("21:13:20.2")), "http.chat": (at("21:13:20.2"), at("21:13:30"))}
    r = stall_report(LOG, windows)
    # the startup stall (21:10:05) and the one at shutdown (21:20:00) are outside the campaign
    assert (r["stalls"], r["max_held_ms"], r["max_on_cpu_ms"], r["on_cpu_over_50ms"]) == (5, 310, 290, 4)
    assert r["by_target"] == {
        "edge.Status": {
            "stalls": 1,
            "max_held_ms": 63,
            "max_on_cpu_ms": 7,
            "max_queued_ms": 50,
            "max_gc_ms": 4,
            "suppressed": 3,
            "on_cpu_over_50ms": 0,
        },
        "http.chat": {
            "stalls": 4,
            "max_held_ms": 310,
            "max_on_cpu_ms": 290,
            "max_queued_ms": 0,
            "max_gc_ms": 0,
            "suppressed": 0,
            "on_cpu_over_50ms": 4,
        },
    }
    kept = r["on_cpu_stacks"]
    assert [(k["at"], k["target"], k["on_cpu_ms"]) for k in kept] == [
        ("2026-11-30 21:13:20,250", "http.chat", 290),
        ("2026-11-30 21:13:21,000", "http.chat", 110),
        ("2026-11-30 21:13:22,000", "http.chat", 60),
    ]  # the first three only
    assert kept[0]["stack"].endswith("json.loads(body)")


def test_no_stall_and_no_target_give_zeros():
    assert stall_report("", {"a": (0.0, 1.0)})["stalls"] == 0
    empty = stall_report(LOG, {})
    assert (empty["stalls"], empty["by_target"], empty["on_cpu_stacks"]) == (0, {}, [])


def test_an_info_stall_of_an_idle_loop_is_counted_too():
    line = (
        "2026-12-02 01:00:00,000 INFO coinfer.loop: event loop held 71 ms (threshold 50 ms), 2 ms of it on CPU, "
        "46 ms waiting for a core, 0 ms collecting garbage; the loop thread was in:\n"
        "  (idle in select: no code on the loop held it; the process was not scheduled or a native call in "
        "another thread held the GIL)\n"
    )
    (stall,) = parse_stalls(line)
    assert (stall.held_ms, stall.on_cpu_ms, stall.queued_ms) == (71.0, 2.0, 46.0) and "idle in select" in stall.stack
