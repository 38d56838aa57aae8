"""Logging for the daemons: one format, and a flood cannot fill the disk.

A failure that repeats per request or per connection (descriptors exhausted: asyncio logs a
traceback for every failed accept, 317,421 of them in 20 s) is the same line again and again.
``RateLimit`` lets each call site (logger, level, message template) through ``burst`` times per
``period_s``, drops the rest, and says how many it dropped when the site speaks again.
"""

from __future__ import annotations

import logging
import threading
import time

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RateLimit(logging.Filter):
    def __init__(self, burst: int = 20, period_s: float = 10.0, clock=time.monotonic) -> None:
        super().__init__()
        self.burst, self.period_s, self.clock = burst, period_s, clock
        self._sites: dict[tuple, list] = {}  # site -> [window start, passed, dropped]
        self._lock = threading.Lock()  # records come from vLLM's and gRPC's threads too

    def filter(self, record: logging.LogRecord) -> bool:
        site = (record.name, record.levelno, record.pathname, record.lineno, str(record.msg)[:200])
        now = self.clock()
        with self._lock:
            state = self._sites.get(site)
            if state is None or now - state[0] >= self.period_s:
                dropped = state[2] if state else 0
                if len(self._sites) > 10_000:  # distinct sites are bounded by the code; this bounds memory anyway
                    self._sites.clear()
                self._sites[site] = [now, 1, 0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} similar lines suppressed in the last {self.period_s:g} s]"
                return True
            if state[1] < self.burst:
                state[1] += 1
                return True
            state[2] += 1
            return False


_limit: RateLimit | None = None


def setup(level: int = logging.INFO, burst: int = 20, period_s: float = 10.0) -> None:
    """The daemons' root logging: ``FORMAT`` on stderr, every handler rate-limited per call site."""
    global _limit
    logging.basicConfig(level=level, format=FORMAT)
    _limit = RateLimit(burst, period_s)
    limit_handlers("")


def limit_handlers(name: str) -> None:
    """Rate-limit the handlers a library installed on its own logger (vLLM logs to stdout through its
    own handler, one warning per request for some client inputs). Nothing before ``setup``."""
    if _limit is None:
        return
    for handler in logging.getLogger(name).handlers:
        if _limit not in handler.filters:
            handler.addFilter(_limit)


def quoted(text: str, limit: int = 128) -> str:
    """Client text fit for a log line: control characters, line breaks and other unprintables escaped
    (a request id of ``"ok\\n2026-... ERROR ..."`` cannot forge a line), at most ``limit`` chars."""
    text = text[:limit]
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
