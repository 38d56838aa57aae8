"""benchmarks.capacity: the ladder's logic around a stand-in replica, and the whole benchmark at a tiny size
on the real parts (vLLM's OpenAI server and coinfer's cloud service, each pinned, the demo pair).

The ladder's tests run on virtual time (tests/virtual_time.py) with the benchmark's clock read from the
loop: a stand-in's latency follows how many requests are in flight, which on the wall clock depended on
how late a busy machine woke each request (three at once where the script had two)."""

from __future__ import annotations

import asyncio
import json
from argparse import Namespace

import pytest

from benchmarks import capacity as cap
from benchmarks import capacity_ladder as ladder
from benchmarks import load_stats
from tests.virtual_time import now, run


class Idle:
    """A replica that spends no CPU (the ladder's logic only)."""

    def cpu_s(self) -> float:
        return 0.0


class Cpu(Idle):
    """``Idle`` with the per-process reading the saturated run takes."""

    def cpu_by_process(self) -> dict[str, float]:
        return {"python": 0.0}


def _ask(latency_at):
    """An ask whose latency grows with the number of requests in flight (a saturating server)."""
    inflight = [0]

    async def ask(req, rid):
        inflight[0] += 1
        try:
            lat = latency_at(inflight[0])
            await asyncio.sleep(lat)
            return ladder.Result(True, lat, lat / 2)
        finally:
            inflight[0] -= 1

    return ask


@pytest.fixture
def virtual_clock(monkeypatch):
    """The benchmark's ``time.perf_counter`` is the running loop's clock (the ladder runs on virtual time)."""
    monkeypatch.setattr(ladder, "time", Namespace(perf_counter=now))


ARGS = Namespace(seed=1, min_rate=0.5, max_steps=6, extend_steps=0, refine_steps=0, step_s=0.5, coarse_points=7)
K = load_stats.grid_index


def _indices(steps) -> list[int]:
    ks = [K(s.rate) for s in steps]
    assert [load_stats.grid_rate(k) for k in ks] == [s.rate for s in steps]  # every rate a point of the grid
    return ks


def test_the_ladder_rises_on_the_grid_until_the_slo_breaks_and_capacity_is_the_last_rate_held(virtual_clock):
    ask = _ask(lambda n: 0.01 if n <= 2 else 0.5)  # fine while two are in flight, then slow
    steps = run(ladder.ladder(ask, [None], 2.0, 0.2, ARGS, Idle(), "t", lambda _: None))
    ks = _indices(steps)
    assert ks[0] == K(2.0) and ks == list(range(ks[0], ks[-1] + 1, 7)) and not steps[-1].held(0.2)
    best = load_stats.capacity(steps, 0.2)
    assert best is not None and best.rate == steps[-2].rate
    entry = load_stats.summary(steps, 0.2, steps[0])
    assert entry["capacity_rps"] == best.rate and entry["accuracy"] == 1.0
    assert entry["cloud_capacity_rps"] == best.rate and entry["edge_only_share"] == 0.0


def test_a_ladder_that_held_every_rate_climbs_on_and_says_its_capacity_is_a_lower_bound(virtual_clock):
    held_all = _ask(lambda n: 0.01)
    args = Namespace(**{**vars(ARGS), "max_steps": 2, "extend_steps": 2})
    steps = run(ladder.ladder(held_all, [None], 1.0, 0.2, args, Idle(), "t", lambda _: None))
    assert _indices(steps) == [0, 7, 21, 35]  # past --max-steps: twice the step
    assert load_stats.summary(steps, 0.2, steps[0])["capacity_lower_bound"] is True
    breaks = _ask(lambda n: 0.01 if n <= 2 else 0.5)
    steps = run(ladder.ladder(breaks, [None], 2.0, 0.2, args, Idle(), "t", lambda _: None))
    entry = load_stats.summary(steps, 0.2, steps[0])
    assert not steps[-1].held(0.2) and entry["capacity_lower_bound"] is False  # a higher rate missed


def test_bisection_ends_with_the_rate_held_and_the_rate_missed_neighbours_on_the_grid(virtual_clock):
    breaks = _ask(lambda n: 0.01 if n <= 2 else 0.5)
    args = Namespace(**{**vars(ARGS), "coarse_points": 8, "refine_steps": 5})
    steps = run(ladder.ladder(breaks, [None], 2.0, 0.2, args, Idle(), "t", lambda _: None))
    ks = _indices(steps)
    held = {k for k, s in zip(ks, steps, strict=True) if s.held(0.2)}
    lo = max(held)
    hi = min(k for k in ks if k not in held and k > lo)
    assert hi - lo == 1  # the capacity bracketed by neighbouring points: known to +-5%
    assert len(steps) - len(set(range(ks[0], max(ks) + 1, 8)) & set(ks)) <= 3  # log2(8) bisections


def test_a_first_rate_that_misses_the_slo_makes_the_ladder_fall(virtual_clock):
    ask = _ask(lambda n: 0.01 if n <= 1 else 0.5)
    steps = run(ladder.ladder(ask, [None], 32.0, 0.2, ARGS, Idle(), "t", lambda _: None))
    assert steps[0].rate == load_stats.grid_rate(K(32.0)) and not steps[0].held(0.2)
    assert [s.rate for s in steps[1:]] == sorted((s.rate for s in steps[1:]), reverse=True)
    assert steps[-1].held(0.2) or K(steps[-1].rate) == K(ARGS.min_rate, up=True)


def test_the_common_rate_step_reuses_the_ladders_own_step_there_and_runs_one_where_the_ladder_did_not_go(
    virtual_clock,
):
    ask = _ask(lambda n: 0.01 if n <= 2 else 0.5)
    args = Namespace(**{**vars(ARGS), "saturate_rounds": 1, "saturate_concurrency": 2, "real_step_s": 1.0})
    reqs = [cap.Request([], None, 8)]

    def measure(common):
        return run(ladder.measure(ask, reqs, None, 0.2, args, Cpu(), "t", lambda _: None, common))

    # a callable is given the system's own entry first (vLLM greedy's, whose capacity sets the common rate)
    entry = measure(lambda e: e["steps"][0]["rate"])
    common = entry["at_common_rate"]
    assert {k: v for k, v in common.items() if k not in ("cpu_s_per_answer", "held")} == entry["steps"][0]
    low = load_stats.grid_rate(K(ARGS.min_rate, up=True) - 5)  # below every rate the ladder tries
    entry = measure(low)
    assert entry["at_common_rate"]["rate"] == low and all(s["rate"] != low for s in entry["steps"])
    assert entry["at_common_rate"]["held"] is True and entry["at_common_rate"]["answers"] >= 1


def test_the_benchmark_at_a_tiny_size_prints_the_contract(capsys):
    assert (
        cap.main(
            [
                "--workloads",
                "arith",
                "--requests",
                "2",
                "--step-s",
                "1",
                "--max-steps",
                "1",
                "--saturate-rounds",
                "1",
                "--saturate-concurrency",
                "2",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["slo_s"]["arith"] > 0
    systems = report["workloads"]["arith"]
    assert set(systems) == set(cap.SYSTEMS)
    for name, entry in systems.items():
        assert {"capacity_rps", "cloud_cpu_s_per_answer", "accuracy", "p50_s", "p95_s", "ttft_p50_s"} <= set(entry)
        assert entry["saturated"]["answers"] >= 1 and entry["saturated"]["failed"] == 0, name
        # the replica's processes were found and measured. A system's own pass here is one answer (the middle
        # half of two), tens of ms read in /proc's 10 ms ticks: 0.0 is a true reading where the answer cost the
        # engine nothing or little (split: one answer in 45 ms read 0.0), so each system is held to >= 0 and
        # its work is counted in engine tokens below; the CPU reading is checked over the whole run
        assert entry["cloud_cpu_s_per_answer"] >= 0, (name, entry["saturated"])
        by = entry["saturated"]["cpu_s_per_answer_by_process"]  # the engine's processes apart from the server's
        assert (
            any(n.startswith("VLLM::") for n in by) and abs(sum(by.values()) - entry["cloud_cpu_s_per_answer"]) < 0.01
        ), by
        # the servers' own count of the engine's work: vLLM's usage, coinfer's Summary.cost (0 is possible
        # there: a draft the rules accept costs the engine nothing)
        tokens = entry["engine_tokens_per_answer"]
        assert tokens is not None and (tokens > 0 if name.startswith("vllm") else tokens >= 0), name
        # and its parts, each as the server counts them: vLLM's usage with its prefix-cache hits, coinfer's cost
        work = entry["work_per_answer"]
        assert {"engine_requests", "prompt_tokens", "cached_tokens", "decoded_tokens"} <= set(work), (name, work)
        assert work["prompt_tokens"] + work["decoded_tokens"] - work["cached_tokens"] == pytest.approx(tokens, abs=0.2)
        assert ("steps" in work) == (name not in ("vllm-ngram", "vllm-best-of-5")), (name, work)
        # every system read at the workload's one common rate, half vLLM greedy's capacity on the grid
        assert entry["at_common_rate"]["rate"] == report["common_rate_rps"]["arith"], name
        assert 0 <= entry["edge_only_share"] <= 1 and entry["cloud_capacity_rps"] <= entry["capacity_rps"]
    # the passes together, long enough to register: plain vLLM decodes every answer (best-of-5 five of them),
    # its worker busy-polling throughout, so the run's replica CPU is never 0 where the readings work
    assert sum(e["cloud_cpu_s_per_answer"] * e["saturated"]["answers"] for e in systems.values()) > 0, systems


def test_the_remote_engines_replica_is_both_servers_each_process_under_its_servers_name():
    from benchmarks.replica import ServerGroup

    class Fixed:
        def __init__(self, by: dict[str, float]) -> None:
            self.by = by

        def cpu_s(self) -> float:
            return sum(self.by.values())

        def cpu_by_process(self) -> dict[str, float]:
            return self.by

        def check(self) -> None:
            pass

    group = ServerGroup(coinfer=Fixed({"python": 0.5}), vllm=Fixed({"python": 2.0, "VLLM::EngineCore": 1.0}))
    assert group.cpu_by_process() == {"coinfer/python": 0.5, "vllm/python": 2.0, "vllm/VLLM::EngineCore": 1.0}
    assert group.cpu_s() == 3.5
    assert not set(cap.REMOTE_SYSTEMS) & set(cap.SYSTEMS)  # asked for by name: not in every run


def test_each_step_goes_on_through_the_requests_where_the_last_left_off(virtual_clock):
    # a step from the first request again re-sent the same problems every step: their repeats were served by the
    # prefix cache (and coinfer's kept check rows), which a list longer than the ladder never repeats
    seen: list[int] = []

    async def ask(req, rid):
        seen.append(req)
        return ladder.Result(True, 0.01, 0.005)

    reqs = list(range(10_000))
    steps = run(ladder.ladder(ask, reqs, 2.0, 0.2, ARGS, Idle(), "t", lambda _: None))
    assert len(steps) > 1 and len(seen) == sum(s.answers for s in steps)
    assert sorted(seen) == list(range(len(seen)))  # every request once, none twice
