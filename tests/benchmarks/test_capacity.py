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


ARGS = Namespace(seed=1, min_rate=0.5, max_steps=6, extend_steps=0, refine_steps=0, step_s=0.5, rate_step=2.0)


def test_the_ladder_rises_until_the_slo_breaks_and_capacity_is_the_last_rate_held(virtual_clock):
    ask = _ask(lambda n: 0.01 if n <= 2 else 0.5)  # fine while two are in flight, then slow
    steps = run(ladder.ladder(ask, [None], 2.0, 0.2, ARGS, Idle(), "t", lambda _: None))
    assert [s.rate for s in steps][:2] == [2.0, 4.0] and not steps[-1].held(0.2)
    best = load_stats.capacity(steps, 0.2)
    assert best is not None and best.rate == steps[-2].rate
    entry = load_stats.summary(steps, 0.2, steps[0])
    assert entry["capacity_rps"] == best.rate and entry["accuracy"] == 1.0


def test_a_ladder_that_held_every_rate_climbs_on_and_says_its_capacity_is_a_lower_bound(virtual_clock):
    held_all = _ask(lambda n: 0.01)
    args = Namespace(**{**vars(ARGS), "max_steps": 2, "extend_steps": 2})
    steps = run(ladder.ladder(held_all, [None], 1.0, 0.2, args, Idle(), "t", lambda _: None))
    assert [s.rate for s in steps] == [1.0, 2.0, 8.0, 32.0]  # past --max-steps: the step squared
    assert load_stats.summary(steps, 0.2, steps[0])["capacity_lower_bound"] is True
    breaks = _ask(lambda n: 0.01 if n <= 2 else 0.5)
    steps = run(ladder.ladder(breaks, [None], 2.0, 0.2, args, Idle(), "t", lambda _: None))
    entry = load_stats.summary(steps, 0.2, steps[0])
    assert not steps[-1].held(0.2) and entry["capacity_lower_bound"] is False  # a higher rate missed


def test_refining_steps_halve_the_gap_between_the_rate_held_and_the_rate_missed(virtual_clock):
    breaks = _ask(lambda n: 0.01 if n <= 2 else 0.5)
    args = Namespace(**{**vars(ARGS), "refine_steps": 2})
    steps = run(ladder.ladder(breaks, [None], 2.0, 0.2, args, Idle(), "t", lambda _: None))
    climbed, refined = steps[:-2], steps[-2:]
    lo = max(s.rate for s in climbed if s.held(0.2))
    hi = min(s.rate for s in climbed if not s.held(0.2) and s.rate > lo)
    assert abs(refined[0].rate - (lo * hi) ** 0.5) < 1e-2  # rates are kept to 3 decimals and lo < refined[0].rate < hi
    assert lo < refined[1].rate < hi and refined[1].rate != refined[0].rate  # inside the new, narrower gap


def test_a_first_rate_that_misses_the_slo_makes_the_ladder_fall(virtual_clock):
    ask = _ask(lambda n: 0.01 if n <= 1 else 0.5)
    steps = run(ladder.ladder(ask, [None], 32.0, 0.2, ARGS, Idle(), "t", lambda _: None))
    assert steps[0].rate == 32.0 and not steps[0].held(0.2)
    assert [s.rate for s in steps[1:]] == sorted((s.rate for s in steps[1:]), reverse=True)
    assert steps[-1].held(0.2) or steps[-1].rate == ARGS.min_rate


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
