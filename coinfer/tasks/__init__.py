"""Task registry: ``get_task("arith")``; unknown names list the known ones."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from coinfer.errors import InvalidArgument
from coinfer.tasks.arith import ArithTask
from coinfer.tasks.base import OpenTask, Parsed, Problem, Task
from coinfer.tasks.select import SelectTask

TASKS: dict[str, Task] = {t.name: t for t in (ArithTask(), SelectTask())}
OPEN = OpenTask()
"""An open request (task ""): no prompt grammar; extraction and rules come with the request."""

__all__ = ["OPEN", "TASKS", "Parsed", "Problem", "Task", "get_task", "is_held_out", "problems"]


def get_task(name: str, field: str = "problem.task") -> Task:
    """The preset named ``name``; "" is an open request."""
    if name == "":
        return OPEN
    try:
        return TASKS[name]
    except KeyError:
        raise InvalidArgument(
            f"{field}: unknown task {name!r} (known: {', '.join(TASKS)}; empty for an open request)"
        ) from None


def is_held_out(prompt: str) -> bool:
    """The fixed train / held-out split (1 in 10 by prompt hash): models train on one side
    only; accuracy, calibration-free gates and the demo use the other."""
    return hashlib.sha256(prompt.encode()).digest()[0] % 10 == 0


def problems(rng: random.Random, tasks: tuple[str, ...], held_out: bool) -> Iterator[Problem]:
    """Endless stream of problems from the train (or held-out) side of the split."""
    while True:
        p = TASKS[rng.choice(tasks)].generate(rng)
        if is_held_out(p.prompt) == held_out:
            yield p
