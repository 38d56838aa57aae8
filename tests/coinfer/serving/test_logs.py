"""A log flood is cut to a burst per call site and period, and the next line says how much was dropped."""

import logging

from coinfer.serving.logs import RateLimit


def _record(msg: str, lineno: int = 1) -> logging.LogRecord:
    return logging.LogRecord("asyncio", logging.ERROR, "x.py", lineno, msg, None, None)


def test_a_flood_from_one_site_is_limited_and_counted():
    now = [0.0]
    limit = RateLimit(burst=3, period_s=10.0, clock=lambda: now[0])
    passed = [limit.filter(_record("socket.accept() out of system resource")) for _ in range(1000)]
    assert sum(passed) == 3
    assert limit.filter(_record("another message")) and limit.filter(_record("same text", lineno=2))  # other sites
    now[0] = 10.0
    r = _record("socket.accept() out of system resource")
    assert limit.filter(r)
    assert "[997 similar lines suppressed in the last 10 s]" in r.getMessage()
    assert sum(limit.filter(_record("socket.accept() out of system resource")) for _ in range(100)) == 2


def test_client_text_cannot_forge_a_log_line():
    from coinfer.serving.logs import quoted

    forged = "abc\n2026-11-30 21:00:00,000 ERROR cloud.server: engine dead\x1b[2J"
    assert "\n" not in quoted(forged) and "\x1b" not in quoted(forged)
    assert quoted(forged).startswith("abc\\n2026")
    assert quoted("ÝìiÝ 42") == "ÝìiÝ 42" and len(quoted("x" * 1000)) == 128


def test_a_librarys_own_handler_is_limited_too():
    from coinfer.serving import logs

    lib = logging.getLogger("some_engine")
    handler = logging.StreamHandler()
    lib.addHandler(handler)
    try:
        logs.setup()
        logs.limit_handlers("some_engine")
        logs.limit_handlers("some_engine")  # idempotent
        assert handler.filters == [logs._limit]
    finally:
        lib.removeHandler(handler)
