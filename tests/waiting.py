"""Waiting in tests for something that happens on its own (a health watch seeing a server, a slot freed):
poll until it holds, the bound only a guard against a hang. Each call names its bound and what it measured,
and the bound is at least 10x that (docs/tests.md), so a busy machine only makes the wait longer."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable

POLL_S = 0.02


async def until(
    holds: Callable[[], bool | Awaitable[bool]], *, guard_s: float, what: str, poll_s: float = POLL_S
) -> float:
    """Poll ``holds`` (a function, or a coroutine function) every ``poll_s`` until it is true; the seconds
    that took. Fails naming ``what`` once ``guard_s`` has passed. With ``COINFER_TEST_WAITS`` set to a file,
    each wait is appended to it (``what``, seconds, guard): how the bounds in docs/tests.md were measured."""
    t0 = time.monotonic()
    while True:
        got = holds()
        if inspect.isawaitable(got):
            got = await got
        took = time.monotonic() - t0
        if got:
            _record(what, took, guard_s)
            return took
        if took > guard_s:
            raise AssertionError(f"{what}: not after {guard_s:g} s (a hang guard; see docs/tests.md)")
        await asyncio.sleep(poll_s)


def _record(what: str, took: float, guard_s: float) -> None:
    if path := os.environ.get("COINFER_TEST_WAITS"):
        with open(path, "a") as f:
            f.write(f"{what}\t{took:.3f}\t{guard_s:g}\n")
