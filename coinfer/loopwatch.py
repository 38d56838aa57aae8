"""How long the serving event loop is held, and by what.

Every request of a daemon shares one asyncio loop: one callback that runs for 300 ms delays every
``Status``, health check and token stream of the process by 300 ms. Load tests see such stalls only
from outside, as latency, and cannot tell code that holds the loop from a machine that did not
schedule the process. ``LoopWatch`` looks from inside:

- the loop stamps a heartbeat every ``period_s``; the late part of each beat is the loop's lag, kept
  in a histogram (``coinfer_event_loop_lag_seconds`` on the daemon's /metrics);
- a watchdog thread notices a beat overdue by more than ``threshold_s`` while it is still overdue and
  takes the loop thread's Python stack at that moment, so the warning names the code holding the
  loop (or shows the loop idle in ``select``: then the process was not scheduled, or a native call
  held the GIL);
- each warning also gives the loop thread's own CPU time over the late beat: near the lag, code on
  the loop ran that long; far below it, the loop was waiting (for the GIL or for a core).

The thread wakes every ``period_s`` and reads one clock: the cost is far under 0.1% of a core.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger("coinfer.loop")

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class LoopWatch:
    def __init__(self, threshold_s: float = 0.05, period_s: float = 0.01,
                 observe: Callable[[float], None] | None = None, frames: int = 12) -> None:
        self.threshold_s, self.period_s, self.observe, self.frames = threshold_s, period_s, observe, frames
        self.stalls = 0  # beats later than threshold_s
        self.worst_s = 0.0
        self._beat = time.monotonic()
        self._cpu = 0.0  # the loop thread's CPU time at the last beat
        self._stack: str | None = None  # the loop thread's stack, taken while the current beat was overdue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LoopWatch:
        """Watch the running loop (call from a coroutine on it)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat, self._cpu = time.monotonic(), time.thread_time()
        self._handle = self._loop.call_later(self.period_s, self._tick)
        self._thread = threading.Thread(target=self._watch, name="loopwatch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _tick(self) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        lag = max(0.0, now - self._beat - self.period_s)
        busy = cpu - self._cpu
        stack, self._stack = self._stack, None
        self._beat, self._cpu = now, cpu
        if self.observe is not None:
            self.observe(lag)
        if lag > self.threshold_s:
            self.stalls += 1
            self.worst_s = max(self.worst_s, lag)
            where = stack or "  (no Python frame held it: the process was not scheduled, or native code held the GIL)\n"
            log.warning("event loop held %.0f ms (threshold %.0f ms), %.0f ms of it on CPU; the loop thread was in:"
                        "\n%s", lag * 1e3, self.threshold_s * 1e3, busy * 1e3, where.rstrip())
        if not self._stop.is_set():
            self._handle = self._loop.call_later(self.period_s, self._tick)

    def _watch(self) -> None:
        while not self._stop.wait(self.period_s):
            overdue = time.monotonic() - self._beat - self.period_s
            if overdue > self.threshold_s and self._stack is None:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    self._stack = "".join(traceback.format_stack(frame, limit=self.frames))


def lag_histogram(registry) -> Callable[[float], None]:
    """``coinfer_event_loop_lag_seconds`` in ``registry``; returns its ``observe``."""
    from prometheus_client import Histogram

    return Histogram("coinfer_event_loop_lag_seconds", "How late the serving event loop ran a 10 ms heartbeat "
                     "(time the loop was held)", buckets=LAG_BUCKETS, registry=registry).observe
