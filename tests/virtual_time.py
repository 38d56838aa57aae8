"""An asyncio event loop on virtual time, for tests of logic whose outcome depends on how long things take
(a scripted engine's delays, a session's deadline, a hedge racing a round of drafts, a heartbeat's timeout).

On a real loop such a test is a race between timers and the machine: a thread scheduled late on a busy
machine makes the draft arrive after the hedge ended instead of before. Here the clock (``loop.time()``,
what ``asyncio.sleep``, ``asyncio.timeout`` and ``wait_for`` read) stands still while anything can run and
jumps to the next timer only when the loop would wait for it:

- code on the loop and work in threads (``asyncio.to_thread``, ``run_in_executor``) take no virtual time:
  while a thread is under way the loop waits for it in real time and the clock stands;
- timers fire in the order of their deadlines, whatever the machine's load.

So the outcome follows the script alone, and a test of "a 12 s refinement against a 0.8 s deadline" takes
milliseconds. Real sockets still work (their events are served first), but a test whose outcome depends on
a real peer's timing gains nothing here.

    from tests.virtual_time import run
    events = run(collect(session.run(inbox())))
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    """The loop's selector: instead of blocking until the next timer, it moves the clock there."""

    def __init__(self) -> None:
        super().__init__()
        self.now = time.monotonic()  # not 0: code that reads 0.0 as "never" (a last output time) stays right
        self.threads = 0
        """Executor jobs under way: the loop waits for them in real time, the clock standing."""

    def select(self, timeout: float | None = None) -> list:
        if timeout == 0:
            return super().select(0)
        ready = super().select(0)
        if ready:  # I/O (a thread's result waking the loop, a socket) first, at the current virtual time
            return ready
        if self.threads or timeout is None:  # a thread's result, or (no timer at all) real I/O, wakes the loop
            return super().select(None)
        self.now += timeout  # nothing can run before the next timer: it is due now
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``asyncio.SelectorEventLoop`` whose ``time()`` is virtual (see the module's docstring)."""

    def __init__(self) -> None:
        self._virtual = _Selector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now

    def stall(self, seconds: float) -> None:
        """The loop stood still for ``seconds`` (a blocking call on it, the process not scheduled): the
        clock moves on and nothing ran meanwhile. Call it from code running on the loop."""
        self._virtual.now += seconds

    def run_in_executor(self, executor, func, *args) -> asyncio.Future:
        fut = super().run_in_executor(executor, func, *args)
        self._virtual.threads += 1
        fut.add_done_callback(self._thread_done)
        return fut

    def _thread_done(self, _fut: asyncio.Future) -> None:
        self._virtual.threads -= 1


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on a ``VirtualTimeLoop``."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)


def now() -> float:
    """The running loop's clock (virtual on a ``VirtualTimeLoop``)."""
    return asyncio.get_running_loop().time()
