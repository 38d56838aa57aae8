"""The servers' own view of their event loops: the stalls ``coinfer.serving.loopwatch`` logs, read back from the
servers' stderr logs and counted over the campaign and per target.

Each stall is a WARNING line, INFO where no code on the loop held it (the loop idle in select; the
log's timestamp is local time, written when the stall ended)::

    2026-11-30 21:13:15,190 WARNING coinfer.loop: event loop held 63 ms (threshold 50 ms), 37 ms of it on CPU; the loop thread was in:
      File "...", line 12, in handler
        check(body)

followed by the loop thread's stack. The on-CPU part tells the two causes apart: near the time held, code
on the loop ran that long; far below it, the loop was waiting for a core or for the GIL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

ON_CPU_MS = 50.0
"""A stall with more than this on the loop thread's CPU: code really held the loop (the liveness budget)."""
STACKS_KEPT = 3

STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
STALL = re.compile(
    r"(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?:WARNING|INFO) coinfer\.loop: event loop held "
    r"(?P<held>[\d.]+) ms \(threshold (?P<threshold>[\d.]+) ms\), (?P<cpu>[\d.]+) ms of it on CPU"
    r"(?:, (?P<queued>[\d.]+) ms waiting for a core)?(?:, (?P<gc>[\d.]+) ms collecting garbage)?"
)
SUPPRESSED = re.compile(r"\[(\d+) similar lines suppressed")


@dataclass(frozen=True)
class Stall:
    at: str
    """The log line's timestamp, as written (to find it in the log)."""
    t: float
    """The same as wall-clock time (seconds since the epoch; the log writes local time)."""
    held_ms: float
    on_cpu_ms: float
    queued_ms: float
    """Time runnable but without a core (0 where the server's platform does not tell)."""
    gc_ms: float
    """Time in Python's garbage collector (0 in older servers' lines)."""
    threshold_ms: float
    stack: str
    """The loop thread's stack under the line (the innermost frame last), or its "no Python frame" note."""


def parse_stalls(log: str) -> list[Stall]:
    """The loop-stall warnings in a server's log text, in order. A stall's stack is the indented lines under
    its header: they end at the next timestamped line, or at any other unindented line (a child process, such
    as vLLM's engine, writes to the same stderr)."""
    stalls: list[Stall] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = STALL.match(line)
        if m is None:
            continue
        stack = []
        for nxt in lines[i + 1 :]:
            if STAMP.match(nxt) or not nxt[:1].isspace():
                break
            stack.append(nxt)
        t = datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        stalls.append(
            Stall(
                m["at"],
                t,
                float(m["held"]),
                float(m["cpu"]),
                float(m["queued"] or 0),
                float(m["gc"] or 0),
                float(m["threshold"]),
                "\n".join(stack),
            )
        )
    return stalls


def stall_stats(stalls: list[Stall]) -> dict:
    return {
        "stalls": len(stalls),
        "max_held_ms": max((s.held_ms for s in stalls), default=0.0),
        "max_on_cpu_ms": max((s.on_cpu_ms for s in stalls), default=0.0),
        "max_queued_ms": max((s.queued_ms for s in stalls), default=0.0),
        "max_gc_ms": max((s.gc_ms for s in stalls), default=0.0),
        # the servers' logs are rate-limited per call site: a stall flood shows as a count on the next line
        "suppressed": sum(int(n) for s in stalls for n in SUPPRESSED.findall(s.stack)),
        "on_cpu_over_50ms": sum(s.on_cpu_ms > ON_CPU_MS for s in stalls),
    }


def stall_report(log: str, windows: dict[str, tuple[float, float]]) -> dict:
    """A server's loop stalls while the targets ran (``windows``: each target's wall-clock start and end; a
    stall counts from the first target's start to the last target's end, so startup stalls do not), per
    target too, and the stacks of the first ``STACKS_KEPT`` stalls with over ``ON_CPU_MS`` on CPU."""
    if not windows:
        return stall_stats([]) | {"by_target": {}, "on_cpu_stacks": []}

    def target_of(t: float) -> str | None:
        return next((name for name, (t0, t1) in windows.items() if t0 <= t < t1), None)

    start, end = min(w[0] for w in windows.values()), max(w[1] for w in windows.values())
    ran = [s for s in parse_stalls(log) if start <= s.t <= end]
    on_cpu = [s for s in ran if s.on_cpu_ms > ON_CPU_MS]
    return stall_stats(ran) | {
        "threshold_ms": max((s.threshold_ms for s in ran), default=None),
        "by_target": {name: stall_stats([s for s in ran if t0 <= s.t < t1]) for name, (t0, t1) in windows.items()},
        "on_cpu_stacks": [
            {"at": s.at, "target": target_of(s.t), "held_ms": s.held_ms, "on_cpu_ms": s.on_cpu_ms, "stack": s.stack}
            for s in on_cpu[:STACKS_KEPT]
        ],
    }
