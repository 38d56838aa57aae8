"""Where work on client data runs: on the event loop when it is small and its cost is ours, in a worker thread
otherwise.

Client data never holds the loop for long: parsing a message, compiling a client's rules and checking a draft
against them run in a worker thread. But the hop itself has a price: ``asyncio.to_thread`` of a function that
does nothing cost 159 us of CPU per call on a 2-core AVX2 VM (the executor's queue, the worker's wake-up, the
loop's wake-up through its self-pipe; 2,000 calls, idle and spaced 2 ms apart alike), more than the work it
moved for a typical draft. A split arithmetic session made 5.6 such hops (the open's conversion, the request's
check, 2.4 drafts' checks, the outcome rows); 0.17 since. Under load that saved no CPU that three interleaved runs
could see (9.0, 8.3, 11.3 ms per answer after, 9.1, 9.1, 10.7 before: docs/measurements.md, "Where the session
layer's CPU goes"): there the worker and the loop are awake anyway. What stays is a check that needs no thread,
no queue and no wake-up to answer.

So work whose cost is bounded by its input's size runs inline below a size: a preset's rules (the project's own
checkers, linear in the text) on at most ``INLINE_CHARS`` characters took 1.6 ms at worst on that machine
(2 checks of 10 hostile shapes of 1,024 characters: chained and wrong equations, nested brackets, long digit
runs, JSON; 3.8 ms at 4,096), typical drafts of 100-300 characters 0.1-0.3 ms. Work whose cost a client sets
(its own patterns, schemas and extraction) passes ``size=None`` and always leaves the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INLINE_CHARS = 1024
"""The largest input (characters, or bytes of a message) that a bounded check handles on the loop."""


async def run_sized(size: int | None, fn: Callable[..., T], *args, limit: int = INLINE_CHARS) -> T:
    """``fn(*args)`` on the loop when ``size`` (of its input) is at most ``limit``, else in a worker thread;
    ``size=None``: the cost is not bounded by a size (a client's rules), always in a thread."""
    if size is not None and size <= limit:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
