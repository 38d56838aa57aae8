"""The tests' virtual-time loop (tests/virtual_time.py): timers fire in deadline order with the clock jumping
between them, threads take no virtual time, and a stall moves the clock with nothing run."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.virtual_time import now, run


def test_an_hour_of_sleeps_passes_at_once_in_deadline_order():
    order: list[str] = []

    async def after(s: float, name: str) -> None:
        await asyncio.sleep(s)
        order.append(name)

    async def main() -> float:
        t0 = now()
        await asyncio.gather(after(3600, "late"), after(0.5, "early"), after(60, "middle"))
        return now() - t0

    wall = time.perf_counter()
    assert run(main()) == pytest.approx(3600) and order == ["early", "middle", "late"]
    assert time.perf_counter() - wall < 10  # a hang guard: the hour is virtual (measured: ~2 ms)


def test_a_thread_takes_no_virtual_time_and_a_timeout_waits_for_it():
    release = threading.Event()

    def work() -> str:
        release.wait(60)  # a hang guard; released in milliseconds
        return "done"

    async def main() -> tuple[str, float]:
        t0 = now()
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: threading.Timer(0.05, release.set).start())  # real time passes meanwhile
        async with asyncio.timeout(0.01):  # virtual: it cannot fire while the thread runs
            got = await asyncio.to_thread(work)
        return got, now() - t0

    assert run(main()) == ("done", 0)


def test_a_stall_moves_the_clock_and_a_timer_due_meanwhile_fires_late():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        loop.call_later(0.1, lambda: fired.append(now()))
        t0 = now()
        loop.stall(0.5)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return fired[0] - t0

    assert run(main()) == 0.5
