"""Circuit breaker logic with a fake clock."""

from coinfer.edge.breaker import CircuitBreaker


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_opens_after_consecutive_failures_and_probes_back():
    clk = Clock()
    b = CircuitBreaker(failures=3, reset_s=10, clock=clk)
    assert b.allow()
    b.failure()
    b.failure()
    assert b.state == "closed" and b.allow()
    b.success()
    b.failure()
    b.failure()
    assert b.state == "closed"  # the success reset the count
    b.failure()
    assert b.state == "open" and not b.allow()
    clk.now = 9.9
    assert not b.allow()
    clk.now = 10.0
    assert b.allow() and b.state == "half_open"
    assert not b.allow()  # one trial at a time
    b.failure()
    assert b.state == "open" and not b.allow()
    clk.now = 20.0
    assert b.allow()
    b.success()
    assert b.state == "closed" and b.allow()


def test_health_watch_opens_and_closes_at_once():
    b = CircuitBreaker(failures=3, reset_s=10, clock=Clock())
    b.health(False)
    assert b.state == "open" and not b.allow()
    b.health(True)
    assert b.state == "closed" and b.allow()
    assert b.why == "health: SERVING"


def test_each_move_is_told_once_with_its_reason():
    moves = []
    b = CircuitBreaker(failures=1, reset_s=10, clock=Clock(), on_change=lambda s, why: moves.append((s, why)))
    b.health(True)  # already closed: no move
    b.failure("cloud gone")
    b.failure("again")  # already open: no move
    b.health(True)
    assert moves == [("open", "cloud gone"), ("closed", "health: SERVING")]


def test_a_breaker_flipped_for_weeks_holds_no_history():
    # it used to append every move to a list read by nothing but tests: a daemon's memory grew with
    # each flap of the health watch
    b = CircuitBreaker(failures=1, reset_s=10, clock=Clock())
    b.health(False)
    b.health(True)
    once = repr(b)
    for _ in range(10_000):
        b.health(False)
        b.health(True)
    assert repr(b) == once


def test_asking_whether_a_probe_would_pass_takes_no_trial():
    clk = Clock()
    b = CircuitBreaker(failures=1, reset_s=10, clock=clk)
    b.failure()
    assert not b.would_allow()
    clk.now = 10.0
    assert b.would_allow() and b.would_allow() and b.state == "open"  # asked twice: still the trial to take
    assert b.allow() and b.state == "half_open"
    assert not b.would_allow() and not b.allow()  # taken: one trial at a time
