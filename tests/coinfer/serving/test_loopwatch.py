"""The loop watch measures how long the loop is held and names the code holding it.

The watch's clock is one the tests move by hand (``HandClock``): a loop held for 0.3 s is the clock moved by
0.3 s while the loop thread waits, really, until the watch's thread has looked. Lags are then exact and a
busy machine adds none (on the real clock a 50 ms hiccup was one more stall, and counts like "one stall"
failed under load); the CPU split still reads the thread's real CPU time. The garbage-collector test keeps
the real clock: a collection's length is what it measures."""

import asyncio
import logging
import sys
import threading
import time

import pytest

from coinfer.serving.loopwatch import LoopWatch, idle_in_select

LOOK_GUARD_S = 10.0
"""How long a hold waits for the watch's thread to look twice: a hang guard (it looks every 10 ms; two looks
measured ~20 ms)."""


def _watch_records(caplog) -> list[logging.LogRecord]:
    """The watch's own records: caplog's handler sits on the root logger and also catches what other code logs
    meanwhile (a garbage collection run by the watch's test can destroy an earlier test's pending task, and
    asyncio logs that as an error)."""
    return [r for r in caplog.records if r.name == "coinfer.loop"]


class HandClock:
    """A monotonic clock that moves only in ``hold``; counts the reads made by threads other than the holder's
    (the watch's thread) so a hold can wait until the watch has seen it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._cond = threading.Condition()
        self._holder = 0
        self._looks = 0

    def __call__(self) -> float:
        with self._cond:
            if threading.get_ident() != self._holder:
                self._looks += 1
                self._cond.notify_all()
            return self.now

    def hold(self, seconds: float) -> None:
        """The loop (the calling thread) held for ``seconds``: the clock moves on and the thread waits until
        the watch's thread has looked twice, so its first look, the one that takes the stack, saw the loop
        held here."""
        with self._cond:
            self._holder = threading.get_ident()
            self.now += seconds
            self._looks = 0
            assert self._cond.wait_for(lambda: self._looks >= 2, timeout=LOOK_GUARD_S), "the watch never looked"


def _hold_the_loop(clock: HandClock, seconds: float) -> None:
    clock.hold(seconds)  # stands for a call that blocks on the loop by mistake (not on the CPU)


def _spin(clock: HandClock, seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:  # on the CPU for ``seconds``, however busy the machine
        pass
    clock.hold(seconds)  # stands for a CPU-bound check run on the loop by mistake


async def _watched(hold, seconds: float, settle_s: float = 0.1) -> tuple[LoopWatch, list[float]]:
    """Run ``hold(clock, seconds)`` on a watched loop between two quiet ``settle_s`` periods."""
    lags: list[float] = []
    clock = HandClock()
    watch = LoopWatch(threshold_s=0.05, period_s=0.01, observe=lags.append, clock=clock).start()
    try:
        await asyncio.sleep(settle_s)
        hold(clock, seconds)
        await asyncio.sleep(settle_s)
    finally:
        watch.stop()
    return watch, lags


def test_a_held_loop_is_measured_and_the_holder_named(caplog):
    with caplog.at_level(logging.WARNING, logger="coinfer.loop"):
        watch, lags = asyncio.run(_watched(_hold_the_loop, 0.3))
    assert watch.stalls == 1 and watch.worst_s == pytest.approx(0.29)  # held 0.3 s, one 10 ms period of it due
    # the beat after it is on time again: each beat's lag is its own, not carried on
    assert sorted(lags)[-1] == pytest.approx(0.29) and sorted(lags)[:-1] == [0.0] * (len(lags) - 1) and lags[-1] == 0
    [record] = [r for r in _watch_records(caplog) if "event loop held" in r.getMessage()]
    assert "_hold_the_loop" in record.getMessage()  # the stack taken while the loop was held


def test_start_up_stalls_are_summed_in_one_line_and_serving_ones_warned(caplog):
    """Before ``arm()`` (the daemon loading: imports, weights) a stall is start-up's: no warning, no stack, not
    in the histogram; once armed, the watch reports as before."""
    lags: list[float] = []
    clock = HandClock()

    async def main() -> LoopWatch:
        watch = LoopWatch(threshold_s=0.1, period_s=0.01, observe=lags.append, armed=False, clock=clock).start()
        try:
            await asyncio.sleep(0.05)
            _hold_the_loop(clock, 0.2)  # an import on the loop, between two beats
            await asyncio.sleep(0.05)
            _hold_the_loop(clock, 0.15)  # the last start-up work: its beat is still open when the daemon arms
            watch.arm()
            watch.arm()  # idempotent
            await asyncio.sleep(0.1)
            _hold_the_loop(clock, 0.3)  # serving: a real stall
            await asyncio.sleep(0.1)
        finally:
            watch.stop()
        return watch

    with caplog.at_level(logging.DEBUG, logger="coinfer.loop"):
        watch = asyncio.run(main())
    assert watch.startup_stalls == 2 and watch.startup_worst_s == pytest.approx(0.19)
    assert watch.stalls == 1 and watch.worst_s == pytest.approx(0.29)
    late = [lag for lag in lags if lag > 0]
    assert late == [pytest.approx(0.29)]  # only the serving stall reached the histogram
    warnings = [r for r in _watch_records(caplog) if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "_hold_the_loop" in warnings[0].getMessage()
    [summary] = [r for r in _watch_records(caplog) if r.levelno == logging.INFO]
    assert "start-up held the event loop 2 time(s)" in summary.getMessage() and "\n" not in summary.getMessage()
    debug = [r.getMessage() for r in _watch_records(caplog) if r.levelno == logging.DEBUG]
    assert len(debug) == 2 and all("\n" not in m for m in debug)  # one line each, no stack


def test_an_armed_watch_with_a_quiet_start_says_nothing(caplog):
    async def main() -> LoopWatch:
        watch = LoopWatch(threshold_s=0.5, period_s=0.01, armed=False, clock=HandClock()).start()
        try:
            await asyncio.sleep(0.05)
            watch.arm()
            await asyncio.sleep(0.05)
        finally:
            watch.stop()
        return watch

    with caplog.at_level(logging.DEBUG, logger="coinfer.loop"):
        watch = asyncio.run(main())
    assert watch.armed and watch.startup_stalls == 0 and watch.stalls == 0
    assert not _watch_records(caplog)


def test_the_warning_tells_code_on_the_loop_from_a_waiting_loop(caplog):
    with caplog.at_level(logging.WARNING, logger="coinfer.loop"):
        asyncio.run(_watched(_spin, 0.2, settle_s=0.05))
        asyncio.run(_watched(_hold_the_loop, 0.3))
    busy, sleeping = [r.getMessage() for r in _watch_records(caplog) if "event loop held" in r.getMessage()]
    cpu = [float(m.split("), ")[1].split(" ms")[0]) for m in (busy, sleeping)]
    # spinning is on CPU (200 ms of the thread's CPU time: at least that), waiting is not (measured 0 ms)
    assert cpu[0] >= 200 and cpu[1] < 50, (busy, sleeping)
    assert "_spin" in busy
    if sys.platform == "linux":  # the rest of the stall split: not on CPU, not queued (asleep: blocked)
        # queued for a core only once woken for the last look (measured 0 ms; the spin's, under load: 5-11 ms)
        assert float(sleeping.split("CPU, ")[1].split(" ms waiting for a core")[0]) < 100, sleeping


def test_time_in_the_garbage_collector_is_told_apart(caplog):
    import gc

    keep = [[] for _ in range(1_000_000)]  # a heap a full collection must walk

    async def main() -> float:
        watch = LoopWatch(threshold_s=0.005, period_s=0.005).start()
        try:
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            gc.collect()
            took = time.perf_counter() - t0
            await asyncio.sleep(0.05)
        finally:
            watch.stop()
        return took

    with caplog.at_level(logging.WARNING, logger="coinfer.loop"):
        took = asyncio.run(main())
    assert keep
    collecting = [
        float(m.split(" ms collecting garbage")[0].rsplit(", ", 1)[1])
        for m in (r.getMessage() for r in _watch_records(caplog))
        if "collecting garbage" in m
    ]
    assert max(collecting) >= 0.5 * took * 1e3, (collecting, took)  # the collection is named as the cause


def test_freezing_the_heap_hides_the_loaded_objects_from_later_collections():
    import gc

    from coinfer.serving.process import freeze_heap

    keep = [[] for _ in range(100_000)]
    try:
        assert freeze_heap() >= len(keep)
    finally:
        gc.unfreeze()


IDLE = (
    '  File "/x/asyncio/base_events.py", line 1884, in _run_once\n    event_list = self._selector.select(timeout)\n'
    '  File "/usr/lib/python3.11/selectors.py", line 468, in select\n'
    "    fd_event_list = self._selector.poll(timeout, max_ev)\n"
)
HELD = IDLE + '  File "/x/edge/service.py", line 227, in parse\n    json.loads(body)\n'


def test_a_stall_with_the_loop_idle_in_select_is_info_without_a_stack():
    """Only code on the loop is worth a warning and its stack; the loop's own select is not."""
    assert idle_in_select(IDLE) and not idle_in_select(HELD) and not idle_in_select("")
    watch = LoopWatch()
    # a handler of its own: once a daemon test ran ``logs.setup``, pytest's capture handlers are
    # rate-limited per call site, and the warnings of other tests' watches spend that site's burst
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("coinfer.loop")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for stack in (IDLE, None, HELD):
            watch._warn(0.09, 0.001, 0.05, 0.0, stack)
        watch._warn(0.09, 0.08, 0.0, 0.0, IDLE)  # 80 ms on the loop's CPU, back in select when seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    idle, unseen, held, busy_then_idle = records
    assert idle.levelno == logging.INFO and unseen.levelno == held.levelno == busy_then_idle.levelno == logging.WARNING
    assert "selectors.py" not in idle.getMessage() and "idle in select" in idle.getMessage()
    # no frame seen: maybe a native call on the loop (a full collection) kept the watchdog out: still warned
    assert "no Python frame" in unseen.getMessage() and "json.loads(body)" in held.getMessage()
    assert watch.stalls == 4  # each still counts
