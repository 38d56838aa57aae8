"""benchmarks.load_stats: the load ladder's arithmetic."""

import random

from benchmarks import load_stats


def test_poisson_arrivals_come_at_the_rate_asked():
    offs = load_stats.arrivals(50.0, 20.0, random.Random(0))
    assert 900 < len(offs) < 1100 and offs == sorted(offs) and offs[-1] < 20.0


def test_the_rate_grid_is_absolute_ten_percent_apart_and_every_point_is_its_own_index():
    assert load_stats.grid_rate(0) == 1.0 and load_stats.grid_rate(24) == 10.0 and load_stats.grid_rate(-24) == 0.1
    for k in range(-30, 60):
        r, nxt = load_stats.grid_rate(k), load_stats.grid_rate(k + 1)
        assert 1.09 < nxt / r < 1.11 or r < 0.05  # (3 decimals blur the smallest rates)
        assert load_stats.grid_index(r) == k
    assert load_stats.grid_index(1.03) == 0 and load_stats.grid_index(1.03, up=True) == 1


def test_work_means_average_each_count_over_the_answers_whose_server_counted_it():
    works = [{"engine_requests": 1, "decoded_tokens": 10, "steps": 11}, {"engine_requests": 3, "decoded_tokens": 20}]
    assert load_stats.work_means(works) == {"engine_requests": 2.0, "decoded_tokens": 15.0, "steps": 11.0}
    assert load_stats.work_means([]) == {}
