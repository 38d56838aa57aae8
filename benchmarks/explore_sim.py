"""The planner's exploration rule alone, on synthetic plans: what its memory (``tau``) costs and buys.

    .venv/bin/python -m benchmarks.explore_sim                    # the default grid of tau and request rates
    .venv/bin/python -m benchmarks.explore_sim --tau 10 30 --rates 0.2 1 --json

A simulation, not a measurement of the system: three plans with fixed latency distributions (normal, in ms),
Poisson arrivals, each request choosing by ``coinfer.edge.planner.planner.latency_draw`` around the plan's own
measured mean (the cost model is taken to be right) and feeding the plan's estimate with what it drew.
Two numbers per (tau, rate):

- ``explore``: the share of requests that ran a plan other than the fastest, after a warm-up fifth;
- ``escape_s``: the trap of ``benchmarks.capacity`` runs S, W and Y: the fastest plan was last measured
  in a burst (5.5 +- 0.5 s at 100 requests a second for 10 s) and the others since; seconds until it runs
  again, and until it runs in 45 of 50 choices (None: not within 20 minutes).

The rule's trade-off: a longer tau explores less (a quiet edge re-measures plans it measured well less
often) and escapes a burst's estimate later (about 7 tau). docs/planner.md quotes a run of the default grid.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from coinfer.edge.planner.planner import latency_draw
from coinfer.estimator import Decayed

PLANS = {"edge": (50.0, 20.0), "split": (300.0, 100.0), "cloud": (400.0, 150.0)}
"""The exploration share's plans: mean and sd of each one's latency in ms (the edge fastest)."""
TRAP = {"cloud": (300.0, 60.0), "split": (100.0, 40.0)}
"""The trap's plans: split the faster, once the burst it was last measured in has passed."""


def _choose(states: dict[str, Decayed], now: float, tau: float, rng: random.Random) -> str:
    aged = {p: s.aged(now, tau) for p, s in states.items()}
    return min(aged, key=lambda p: (latency_draw(aged[p].mean, aged[p], rng), aged[p].mean))


def explore_share(tau: float, rate: float, requests: int, seed: int = 0) -> float:
    """The share of requests (after the first fifth) that ran a plan other than the fastest."""
    rng = random.Random(seed)
    states = {p: Decayed() for p in PLANS}
    now, other, counted = 0.0, 0, 0
    for i in range(requests):
        now += rng.expovariate(rate)
        p = _choose(states, now, tau, rng)
        if i >= requests // 5:
            counted += 1
            other += p != "edge"
        mean, sd = PLANS[p]
        states[p] = states[p].add(max(0.0, rng.gauss(mean, sd)), now, tau)
    return other / counted


def escape_s(tau: float, rate: float, seed: int = 0, horizon_s: float = 1200.0) -> tuple[float | None, float | None]:
    """(seconds until split runs again, until it runs in 45 of 50 choices) after the burst."""
    rng = random.Random(seed)
    burst, t = Decayed(), -10.0
    while t < 0:  # split at 5.5 s a request, 100 a second for 10 s, ending at 0
        burst, t = burst.add(max(0.0, rng.gauss(5_500.0, 500.0)), t, tau), t + 0.01
    cloud, t = Decayed(), -60.0
    while t < 0:  # the cloud plan's own ladder since, overloaded too at 900 ms
        cloud, t = cloud.add(max(0.0, rng.gauss(900.0, 300.0)), t, tau), t + 0.02
    states, now, first, mostly, last = {"cloud": cloud, "split": burst}, 0.0, None, None, []
    while now < horizon_s and mostly is None:
        now += rng.expovariate(rate)
        p = _choose(states, now, tau, rng)
        first = now if first is None and p == "split" else first
        last = (last + [p == "split"])[-50:]
        mostly = now if len(last) == 50 and sum(last) >= 45 else None
        mean, sd = TRAP[p]
        states[p] = states[p].add(max(0.0, rng.gauss(mean, sd)), now, tau)
    return first, mostly


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.explore_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tau", type=float, nargs="+", default=[10.0, 30.0, 60.0, 300.0], help="memories, seconds")
    ap.add_argument("--rates", type=float, nargs="+", default=[1 / 60, 1 / 20, 0.2, 1.0, 10.0, 100.0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per exploration-share cell")
    ap.add_argument("--trap-rate", type=float, default=20.0, help="requests a second in the trap")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = {
        f"tau={tau:g}": {
            "explore": {f"{r:.3g}/s": round(explore_share(tau, r, args.requests), 3) for r in args.rates},
            "escape_s": [None if x is None else round(x, 1) for x in escape_s(tau, args.trap_rate)],
        }
        for tau in args.tau
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            cells = ", ".join(f"{r} {s:.1%}" for r, s in v["explore"].items())
            print(f"{k}: explore {cells}; trap escaped at {v['escape_s'][0]} s, left at {v['escape_s'][1]} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
