"""Client patterns: refused before a slow compile, matched within a budget, with the GIL released."""

import sys
import threading
import time

import pytest
import regex

from coinfer import userregex
from coinfer.userregex import MAX_EXPANDED, expanded_size


@pytest.mark.parametrize(
    "pattern, size",
    [
        ("a{1000000}", 1_000_000),
        ("(a{1000}){1000}", 1_000_000),  # nested repeats multiply
        ("(ab){5000}", 10_000),
        (r"\w{1,60000}", 1),  # the maximum is not expanded (compiles as fast as \w)
        ("[a-z]{3}", 3),  # a set is one element
        ("[]a{}]{4}", 4),  # a ] first in a set is literal; braces inside a set are not repeats
        ("[[:alpha:]]{5}", 5),
        (r"\p{L}{3}", 3),  # braces of an escape are not a repeat
        (r"\{1000000}", 9),  # an escaped brace is literal
        ("x{1000000", 9),  # so is an unclosed one
        ("ab|cd", 5),  # every alternative is compiled
    ],
)
def test_expanded_size(pattern, size):
    assert expanded_size(pattern) == size


def test_a_pattern_that_expands_past_the_limit_is_refused_before_compiling(monkeypatch):
    compiled: list[str] = []
    compile_ = regex.compile

    def recorded(pattern, *a, **kw):
        compiled.append(pattern)
        return compile_(pattern, *a, **kw)

    monkeypatch.setattr(regex, "compile", recorded)
    with pytest.raises(regex.error, match=f"expands to about 1000000 elements.*limit is {MAX_EXPANDED}"):
        userregex.compile("(a{1000}){1000}")  # regex.compile: ~0.4 s
    assert compiled == []  # refused by the linear scan, never handed to the compiler
    assert userregex.compile("(?P<answer>-?\\d{1,12})").search("x = 42")["answer"] == "42"
    assert compiled == ["(?P<answer>-?\\d{1,12})"]


def test_a_match_over_budget_stops_and_leaves_the_gil_to_other_threads(monkeypatch):
    # a budget of 0.5 s (20 ms in serving): the other thread has that long to be scheduled while the match
    # runs (measured: a few ms, on a busy machine too)
    monkeypatch.setattr(userregex, "BUDGET_S", 0.5)
    rx = userregex.compile("(a|aa)+$")
    stop, spins = threading.Event(), [0]

    def spin() -> None:
        while not stop.is_set():
            spins[0] += 1
            time.sleep(0.001)  # lets this thread's GIL go, so the test thread gets it back between matches

    interval = sys.getswitchinterval()
    # no forced switches: a thread waiting for the GIL gets it only when its holder lets it go (a blocking
    # call, or a match with concurrent=True). Between the two readings of ``spins`` this thread blocks only
    # in the match, so the count moves only if the match let the GIL go
    sys.setswitchinterval(60.0)
    t = threading.Thread(target=spin)
    t.start()
    try:
        before = spins[0]
        t0 = time.perf_counter()
        with pytest.raises(userregex.RegexTimeout, match="took over 500 ms"):
            userregex.search(rx, "a" * 60 + "b")
        elapsed = time.perf_counter() - t0
        during = spins[0] - before
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        t.join()
    assert during > 0  # the other thread ran during the match (with the GIL held it cannot)
    assert elapsed < 10.0  # a hang guard, 12x what the match took to stop at its budget (measured 0.5-0.8 s)
