"""Children die with their parent, SIGKILL included (vLLM's engine once outlived its server),
for both ways vLLM starts its engine: fork and spawn."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import psutil
import pytest

from coinfer.serving import process

PARENT = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from coinfer.serving import process
    process.watch_parent_if_spawned()  # top level of the main module, as in cloud/server.py

    def sleep():
        print("ready", flush=True)  # its watchers are armed by now: spawn's at import, fork's in the fork hook
        time.sleep(600)

    if __name__ == "__main__":
        method = sys.argv[1]
        process.children_die_with_parent()
        child = multiprocessing.get_context(method).Process(target=sleep)
        child.start()
        print(child.pid, flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_ends_when_its_parent_is_killed(tmp_path, method):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    parent = subprocess.Popen([sys.executable, str(script), method], stdout=subprocess.PIPE, text=True, env=env)
    # the parent's line (the child's pid) and the child's "ready", in either order: the child is killed
    # only once it says its watchers are armed (a fixed 1 s sleep before was a race with a slow spawn)
    lines = {parent.stdout.readline().strip() for _ in range(2)}
    assert "ready" in lines, lines
    child = psutil.Process(int(next(line for line in lines if line != "ready")))
    try:
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE  # alive while the parent is
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        child.wait(timeout=5)  # raises TimeoutExpired if it outlives its parent (a hang guard: 25x the 0.2 s poll)
    finally:
        if child.is_running():
            child.kill()


def test_the_hook_does_nothing_in_a_process_that_is_not_being_spawned():
    from coinfer.serving import process

    before = {t.name for t in __import__("threading").enumerate()}
    process.watch_parent_if_spawned()
    assert "die-with-parent" not in before and "die-with-parent" not in {
        t.name for t in __import__("threading").enumerate()
    }


def test_worker_threads_run_below_the_loop():
    import asyncio

    from coinfer.serving.process import WORKER_NICE, prioritise_loop

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def main() -> tuple[int, int]:
        prioritise_loop(asyncio.get_running_loop(), workers=1)
        return nice(), await asyncio.to_thread(nice)

    loop_nice, worker_nice = asyncio.run(main())
    assert worker_nice == min(19, loop_nice + WORKER_NICE)
    assert nice() == loop_nice  # the calling thread is untouched


TRACKER_NICE = textwrap.dedent(
    """
    import multiprocessing, os, sys, threading
    from multiprocessing import resource_tracker
    from coinfer.serving import process

    if sys.argv[1] == "early":
        process.start_resource_tracker()

    def start_engine():  # as vLLM's engine starts: a spawned child, from a worker thread below the loop
        process._lower_priority()
        p = multiprocessing.get_context("spawn").Process(target=int)
        p.start()
        p.join()

    t = threading.Thread(target=start_engine)
    t.start()
    t.join()
    print(os.getpriority(os.PRIO_PROCESS, resource_tracker._resource_tracker._pid))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_resource_tracker_runs_at_the_servers_priority_not_the_engine_threads():
    def tracker_nice(when: str) -> int:
        out = subprocess.run([sys.executable, "-c", TRACKER_NICE, when], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert tracker_nice("lazy") == min(19, base + process.WORKER_NICE)  # what a SIGKILLed server left starving
    assert tracker_nice("early") == base
