"""benchmarks.load_stats: the load ladder's arithmetic."""

import random

from benchmarks import load_stats


def test_poisson_arrivals_come_at_the_rate_asked():
    offs = load_stats.arrivals(50.0, 20.0, random.Random(0))
    assert 900 < len(offs) < 1100 and offs == sorted(offs) and offs[-1] < 20.0
