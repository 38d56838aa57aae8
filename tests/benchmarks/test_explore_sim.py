"""The exploration rule's simulation: its trade-off runs the way docs/planner.md says."""

import json

from benchmarks import explore_sim


def test_a_longer_memory_explores_less_and_escapes_a_bursts_estimate_later():
    short, long = (explore_sim.explore_share(tau, 0.2, 1_000) for tau in (10.0, 60.0))
    assert 0.0 < long < short < 0.5
    (first_short, _), (first_long, _) = (explore_sim.escape_s(tau, 20.0) for tau in (10.0, 60.0))
    assert first_short is not None and first_long is not None and 3 * 10.0 < first_short < first_long


def test_the_grid_prints_as_json(capsys):
    assert explore_sim.main(["--tau", "10", "--rates", "1", "--requests", "200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["tau=10"]) == {"explore", "escape_s"}
