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
- each warning also splits the late beat by what the loop thread did (Linux's per-thread schedstat):
  on the CPU (code on the loop ran that long), waiting for a core (the machine was busy), or
  neither, i.e. blocked: waiting for the GIL a native call in another thread held, or in a system call;
  and the part of it spent in Python's garbage collector (it stops every thread: a full collection
  over the millions of objects vLLM and torch allocate took over 500 ms).

A daemon's start holds its loop by design, before any request can arrive: importing torch and vLLM
held the cloud's for 2.7 s; loading models and the first full collection hold it too. A watch made
with ``armed=False`` counts every beat before ``arm()`` (called once the daemon serves) as start-up's:
it logs each such stall at DEBUG without a stack, keeps it out of ``observe`` (the histogram is the
serving loop's: one start-up sample would sit in its top bucket for the process's life), and
``arm()`` sums them in one INFO line.

``coinfer.serving.process.freeze_heap`` is the fix for the garbage collector's part: called once a daemon has
loaded its models, it moves every object alive then out of the collector's sight (``gc.freeze``), so
later collections only walk what requests allocate.

What it costs, idle (measured on a 2-core AVX2 VM, ``period_s`` 10 ms, 4 runs of 8 s): 1.9-2.3% of a core,
nearly all of it the 100 wakeups a second of the loop's timer (a bare ``call_later`` chain at 10 ms costs 1.6%: on
a VM each wakeup, not the Python it runs, is the price); the watchdog thread sleeps until a beat would be
``threshold_s`` overdue, so it wakes about 20 times a second. A longer ``period_s`` costs proportionally less and
measures each stall up to one period short (a stall is seen from the first beat it delays).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger("coinfer.loop")

LOOK_MARGIN_S = 0.001  # the watchdog looks this long after a beat would cross the threshold

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class LoopWatch:
    def __init__(
        self,
        threshold_s: float = 0.05,
        period_s: float = 0.01,
        observe: Callable[[float], None] | None = None,
        frames: int = 12,
        armed: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold_s, self.period_s, self.observe, self.frames = threshold_s, period_s, observe, frames
        self.clock = clock  # what beats and stalls are measured on (tests pass a clock they move by hand)
        self.armed = armed  # False: the daemon is starting; stalls are start-up's until ``arm()``
        self.stalls = 0  # beats later than threshold_s while armed
        self.worst_s = 0.0
        self.startup_stalls = 0  # the same before ``arm()``
        self.startup_worst_s = 0.0
        self._beat = self.clock()
        self._cpu = 0.0  # the loop thread's CPU time at the last beat
        self._wait = 0.0  # its time runnable but waiting for a core, at the last beat
        self._schedstat: int | None = None  # /proc/thread-self/schedstat of the loop thread
        self._gc_s = 0.0  # seconds in the garbage collector since start (any thread: it stops them all)
        self._gc_at_beat = 0.0
        self._gc_started = 0.0
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
        try:  # opened here, on the loop thread: the descriptor stays bound to this thread
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:  # not Linux: the warning leaves the split out
            self._schedstat = None
        self._beat, self._cpu, self._wait = self.clock(), time.thread_time(), self._runqueue()
        gc.callbacks.append(self._on_gc)
        self._handle = self._loop.call_later(self.period_s, self._tick)
        self._thread = threading.Thread(target=self._watch, name="loopwatch", daemon=True)
        self._thread.start()
        return self

    def arm(self) -> None:
        """The daemon serves from now on: report stalls as warnings with the holder's stack and feed
        ``observe``. Call on the loop thread; a second call does nothing."""
        if self.armed:
            return
        if self._loop is not None:  # the beat in progress spans start-up's last work: close it as start-up's
            self._startup(self._next_beat()[0])
        self.armed = True
        if self.startup_stalls:
            log.info(
                "start-up held the event loop %d time(s), worst %.0f ms (imports, model loading); the watch "
                "reports stalls from now on",
                self.startup_stalls,
                self.startup_worst_s * 1e3,
            )

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self._gc_s += time.perf_counter() - self._gc_started

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None

    def _runqueue(self) -> float:
        """Seconds the loop thread has spent runnable but not running (0 where unknown)."""
        if self._schedstat is None:
            return 0.0
        try:
            return int(os.pread(self._schedstat, 128, 0).split()[1]) / 1e9  # "<on cpu ns> <waiting ns> <slices>"
        except (OSError, ValueError, IndexError):
            return 0.0

    def _next_beat(self) -> tuple[float, float, float, float, str | None]:
        """Stamp a beat; (lag, seconds on CPU, queued for a core, collecting garbage, the stack taken
        while it was overdue) since the last one."""
        now, cpu, wait = self.clock(), time.thread_time(), self._runqueue()
        lag = max(0.0, now - self._beat - self.period_s)
        busy, queued, collecting = cpu - self._cpu, wait - self._wait, self._gc_s - self._gc_at_beat
        stack, self._stack = self._stack, None
        self._beat, self._cpu, self._wait, self._gc_at_beat = now, cpu, wait, self._gc_s
        return lag, busy, queued, collecting, stack

    def _startup(self, lag: float) -> None:
        if lag > self.threshold_s:
            self.startup_stalls += 1
            self.startup_worst_s = max(self.startup_worst_s, lag)
            log.debug("start-up held the event loop %.0f ms", lag * 1e3)

    def _tick(self) -> None:
        lag, busy, queued, collecting, stack = self._next_beat()
        if not self.armed:
            self._startup(lag)
        else:
            if self.observe is not None:
                self.observe(lag)
            if lag > self.threshold_s:
                self._warn(lag, busy, queued, collecting, stack)
        if not self._stop.is_set():
            self._handle = self._loop.call_later(self.period_s, self._tick)

    def _warn(self, lag: float, busy: float, queued: float, collecting: float, stack: str | None) -> None:
        self.stalls += 1
        self.worst_s = max(self.worst_s, lag)
        split = "" if self._schedstat is None else f", {queued * 1e3:.0f} ms waiting for a core"
        split += f", {collecting * 1e3:.0f} ms collecting garbage"
        head = "event loop held %.0f ms (threshold %.0f ms), %.0f ms of it on CPU%s; the loop thread was in:\n%s"
        args = (lag * 1e3, self.threshold_s * 1e3, busy * 1e3, split)
        if stack is not None and idle_in_select(stack) and busy < self.threshold_s / 2:
            # no code on the loop to name (it was waiting in select, and barely on the CPU): the stack of the
            # loop's own select would only be noise (a 2-core demo printed a 25-line one per stall); INFO,
            # and one line on what it means. No stack at all stays a warning: the watchdog could not run,
            # which a native call on the loop (a full garbage collection) causes as well as another thread;
            # so does a loop on the CPU that was back in select by the time the watchdog looked.
            log.info(
                head,
                *args,
                "  (idle in select: no code on the loop held it; the process was not scheduled "
                "or a native call in another thread held the GIL)",
                extra={"watch": id(self)},
            )
            return
        where = (
            stack
            or "  (no Python frame was seen: the watchdog did not run either, so the process was not "
            "scheduled or a native call held the GIL)\n"
        )
        # ``watch``: which watch warned (several servers' watches may share one loop: a test process)
        log.warning(head, *args, where.rstrip(), extra={"watch": id(self)})

    def _watch(self) -> None:
        # The thread sleeps until the beat it last saw would be ``threshold_s`` overdue, not one period: while
        # the loop beats, it wakes about every ``threshold_s`` (20 times a second at the defaults, where
        # waking every beat cost 1% of a core), and it looks at a stall the moment it crosses the threshold.
        wait = self.period_s + self.threshold_s
        while not self._stop.wait(wait):
            overdue = self.clock() - self._beat - self.period_s
            if overdue <= self.threshold_s:
                wait = self.threshold_s - overdue + LOOK_MARGIN_S
                continue
            # start-up's stalls are expected and logged without a stack: take none
            if self._stack is None and self.armed:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    self._stack = "".join(traceback.format_stack(frame, limit=self.frames))
            wait = self.threshold_s  # the loop is still held: look again later, once


def idle_in_select(stack: str) -> bool:
    """The stack (innermost frame last, as ``traceback.format_stack`` writes it) is the loop waiting in
    its selector: nothing on the loop was running when the watchdog looked."""
    frames = [line for line in stack.splitlines() if line.lstrip().startswith("File ")]
    return bool(frames) and frames[-1].split('"')[1].endswith("selectors.py")


def lag_histogram(registry) -> Callable[[float], None]:
    """``coinfer_event_loop_lag_seconds`` in ``registry``; returns its ``observe``."""
    from prometheus_client import Histogram

    return Histogram(
        "coinfer_event_loop_lag_seconds",
        "How late the serving event loop ran a 10 ms heartbeat (time the loop was held)",
        buckets=LAG_BUCKETS,
        registry=registry,
    ).observe
