"""Process hygiene for the daemons: enough descriptors, no orphans, the event loop ahead of its workers.

vLLM starts its engine core (and its workers) as child processes. vLLM's workers watch their
parent through a pipe, but the engine core does not watch the server: a SIGKILLed server left
it running with its memory (1.7 GB here). Both ways vLLM starts it are covered:

- spawn (vLLM's CPU platform forces it): the child re-imports the server's main module while
  unpickling its preparation data; ``watch_parent_if_spawned`` at that module's top level starts
  the watcher there (and in the engine's own spawned workers, which import the same module);
- fork (vLLM's default elsewhere): ``children_die_with_parent`` registers a fork hook, inherited
  by every child, that starts the watcher in each forked child.

Two watchers: the kernel's ``PR_SET_PDEATHSIG`` (SIGKILL when the parent dies; needs no GIL),
and a thread polling ``getppid`` as the portable fallback.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

POLL_S = 0.2
PR_SET_PDEATHSIG = 1
_forking_pid = 0
_registered = False


def _note_parent() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)  # re-parented: the server is gone, and so is anyone to serve


def _kernel_watch(parent: int) -> None:
    """``PR_SET_PDEATHSIG``: the kernel kills us with our parent, needing neither the GIL nor a running
    thread (a worker blocked in a native call that holds the GIL outlived its engine). It fires when the
    parent's spawning *thread* exits: vLLM starts its engine from a long-lived thread (the loop's default
    executor), so that is the server's lifetime; the polling watcher stays as the portable fallback."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def _start_watcher(parent: int) -> None:
    _kernel_watch(parent)
    threading.Thread(target=_watch, args=(parent,), name="die-with-parent", daemon=True).start()


def _in_child() -> None:
    _start_watcher(_forking_pid)


def watch_parent_if_spawned() -> None:
    """In a process multiprocessing is spawning (it is importing its parent's main module): die with
    the parent. Anywhere else: nothing."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # set by spawn while it prepares
        _start_watcher(os.getppid())


def children_die_with_parent() -> None:
    """From now on, every forked child of this process ends within ``POLL_S`` of its parent's death."""
    global _registered
    if not _registered:  # hooks cannot be unregistered: once per process
        os.register_at_fork(before=_note_parent, after_in_child=_in_child)
        _registered = True


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, from the calling (main) thread. vLLM's engine starts from a
    worker thread that ``prioritise_loop`` runs ``WORKER_NICE`` below the loop, and the tracker, started lazily at
    the engine's first spawn, inherited that thread's nice value. It has no parent watch of its own: it ends when
    the last process holding its pipe has ended, after unlinking the shared memory vLLM left; at nice 5 on a busy
    machine that took over 15 s after a SIGKILLed server (the fault campaign, a CI run with both cores loaded)."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def raise_fd_limit(want: int = 65536) -> int:
    """Lift the soft descriptor limit towards the hard one (a shell's soft default is 1024); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


WORKER_NICE = 5
"""How much lower than the event loop the daemons' worker threads run (``prioritise_loop``)."""


def _lower_priority(delta: int = WORKER_NICE) -> None:
    """Raise this thread's nice value by ``delta`` (Linux: nice is per thread; elsewhere: a no-op).
    Threads it starts inherit the value: ONNX Runtime's intra-op pool made here runs at it too."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + delta)
    except (AttributeError, OSError):  # no per-thread priorities here: run at the loop's
        pass


def prioritise_loop(loop: asyncio.AbstractEventLoop, workers: int | None = None, nice: int = WORKER_NICE) -> None:
    """Give ``loop`` a default executor whose threads run ``nice`` below it (0: as it is).

    The daemons move CPU work off their event loop (drafting with ONNX Runtime, client rules,
    parsing), but on a box with few cores those threads still take the cores from the loop: the
    edge's /healthz waited 75-95 ms while drafts ran on 2 cores, its loop on the CPU for 0-4 ms of
    that. Below the loop's priority, work still gets every idle core, and a woken loop thread gets
    a core at once. (Nice only orders the threads of this machine against each other; it never
    lends priority the user did not have.)"""
    if nice > 0:
        loop.set_default_executor(
            ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="worker", initializer=_lower_priority, initargs=(nice,)
            )
        )


def freeze_heap() -> int:
    """Collect once, then hide every object alive now from later collections (``gc.freeze``). Call it
    once a daemon has loaded its models: the engines, tokenizers and modules stay alive for the
    process's life anyway, and a full collection walking them (millions of objects with vLLM and
    torch) held the event loop for over 500 ms. Again after a reload (an engine restart): the old
    engine's objects are unfrozen first, so its cycles are collected. Returns how many are frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
