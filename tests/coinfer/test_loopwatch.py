"""The loop watch measures how long the loop is held and names the code holding it."""

import asyncio
import logging
import sys
import time

from coinfer.loopwatch import LoopWatch


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # stands for a CPU-bound check run on the loop by mistake


async def _run(caplog) -> tuple[LoopWatch, list[float]]:
    lags: list[float] = []
    watch = LoopWatch(threshold_s=0.05, period_s=0.01, observe=lags.append).start()
    try:
        await asyncio.sleep(0.1)
        _hold_the_loop(0.3)
        await asyncio.sleep(0.1)
    finally:
        watch.stop()
    return watch, lags


def test_a_held_loop_is_measured_and_the_holder_named(caplog):
    with caplog.at_level(logging.WARNING, logger="coinfer.loop"):
        watch, lags = asyncio.run(_run(caplog))
    assert watch.stalls == 1 and 0.25 < watch.worst_s < 1.0
    assert len(lags) >= 10 and sorted(lags)[len(lags) // 2] < 0.05  # the other beats were on time
    [record] = [r for r in caplog.records if "event loop held" in r.getMessage()]
    assert "_hold_the_loop" in record.getMessage()  # the stack taken while the loop was held


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _busy() -> LoopWatch:
    watch = LoopWatch(threshold_s=0.05, period_s=0.01).start()
    try:
        await asyncio.sleep(0.05)
        _spin(0.2)
        await asyncio.sleep(0.05)
    finally:
        watch.stop()
    return watch


def test_the_warning_tells_code_on_the_loop_from_a_waiting_loop(caplog):
    with caplog.at_level(logging.WARNING, logger="coinfer.loop"):
        asyncio.run(_busy())
        asyncio.run(_run(caplog))
    busy, sleeping = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    cpu = [float(m.split("), ")[1].split(" ms")[0]) for m in (busy, sleeping)]
    assert cpu[0] > 100 and cpu[1] < 50, (busy, sleeping)  # spinning is on CPU, sleeping is not
    assert "_spin" in busy
    if sys.platform == "linux":  # the rest of the stall split: not on CPU, not queued (asleep: blocked)
        assert float(sleeping.split("CPU, ")[1].split(" ms waiting for a core")[0]) < 100, sleeping
