"""Persisted state (planner estimates, learned scheduler weights) read through a schema.

A file that is unreadable, truncated or of the wrong shape (``{"values": []}``, a weight ``"x"``,
``NaN``) must never stop a service or poison it: it is validated with pydantic on load, and an
invalid one is moved aside (``<name>.invalid-<unix time>``, kept for the operator) with one ERROR
log line; the service starts from its defaults and writes a fresh file on its next save. A file is
written whole or not at all (``write_atomic``), and from the event loop only through ``OffLoopWriter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def load(path: Path | None, schema: type[M]) -> M | None:
    """The file at ``path`` validated as ``schema``; None when there is none or it was set aside."""
    if path is None or not path.is_file():
        return None
    try:
        return schema.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
        why = (
            f"{exc.error_count()} schema error(s), first: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"
            if isinstance(exc, ValidationError)
            else f"{type(exc).__name__}: {str(exc)[:120]}"
        )
        aside = path.with_name(f"{path.name}.invalid-{int(time.time())}")
        try:
            path.rename(aside)
            where = f"moved to {aside.name}"
        except OSError as err:
            where = f"could not be moved aside ({err.strerror})"
        log.error("%s: invalid state file (%s); %s, starting from defaults", path, why, where)
        return None


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename: a reader sees the old file or the new one,
    never half of one. Blocking: call it off the event loop (``OffLoopWriter``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class OffLoopWriter:
    """Writes a file's latest state in a worker thread, one write at a time, so that a caller on the event loop
    never waits for the disk (a per-request save held every request behind it), and at most once per
    ``min_interval_s``: a state changed by every answer (the planner's estimates) was rendered and written once
    per answer, 1,377 writes for 1,400 answers at 40 answers/s, each a JSON dump on the loop and a thread hop.
    ``write`` takes the state's renderer, called on the loop when the write begins, so saves handed in while a
    write is under way or the interval runs coalesce into one rendering of the latest state. ``flush`` cuts
    the interval short. Outside an event loop (a script) it writes at once: there is no loop to hold."""

    def __init__(self, path: Path, min_interval_s: float = 0.0) -> None:
        self.path, self.min_interval_s = path, min_interval_s
        self._pending: Callable[[], str] | None = None
        self._task: asyncio.Task | None = None
        self._hurry: asyncio.Event | None = None  # made with each drain's task: bound to that task's loop

    def write(self, render: Callable[[], str]) -> None:
        """Persist what ``render()`` returns, soon: from the event loop in a worker thread, rendered when the
        write begins (the state as it is then); outside one, at once."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._pending = None
            self._write(render())
            return
        self._pending = render
        if self._task is None or self._task.done():
            self._hurry = asyncio.Event()
            self._task = loop.create_task(self._drain(), name=f"write {self.path.name}")

    async def flush(self) -> None:
        """Wait until every state handed in is written (a daemon's shutdown): the interval is cut short."""
        while self._task is not None and not self._task.done():
            self._hurry.set()
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        hurry = self._hurry
        while self._pending is not None:
            render, self._pending = self._pending, None
            await asyncio.to_thread(self._write, render())
            if self.min_interval_s > 0 and not hurry.is_set():
                # saves handed in meanwhile wait out the interval (or a flush) and are written as one
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hurry.wait(), self.min_interval_s)

    def _write(self, text: str) -> None:
        try:
            write_atomic(self.path, text)
        except OSError as exc:  # a full or read-only disk must not fail a request; the next save tries again
            log.warning("%s: not written (%s)", self.path, exc)
