"""Task registry: ``get_task("arith")``; unknown names list the known ones."""

from __future__ import annotations

from coinfer.errors import InvalidArgument
from coinfer.tasks.arith import ArithTask
from coinfer.tasks.base import Parsed, Problem, Task
from coinfer.tasks.select import SelectTask

TASKS: dict[str, Task] = {t.name: t for t in (ArithTask(), SelectTask())}

__all__ = ["TASKS", "Parsed", "Problem", "Task", "get_task"]


def get_task(name: str, field: str = "problem.task") -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise InvalidArgument(f"{field}: unknown task {name!r} (known: {', '.join(TASKS)})") from None
