"""The planner against reality: every plan, run for real, in a matrix of network / edge / cloud scenarios.

    .venv/bin/python -m benchmarks.scenarios [--quick] [--reps 3] [--out docs/planner]

The command line of ``scenarios.planner`` (the scenario code, which the tests import too); what it
runs and reports is described there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from scenarios.planner import PLANS, Runner, matrix, summarise, write_report


async def main_async(args) -> dict:
    runner = Runner(args.reps, args.warmup, args.quality_floor, args.busy_clients)
    await runner.setup()
    rows = []
    try:
        for sc in matrix(args.quick):
            row = await runner.scenario(sc)
            rows.append(row)
            print(
                f"{row['scenario']:>28}: "
                + "  ".join(f"{p} {row['predicted_ms'][p]:.0f}/{row['measured_ms'][p]:.0f}" for p in PLANS)
                + f"  chose {row['chosen']} (best {row['best']}, regret {row['regret']:.2f}; split vs cloud: "
                f"{row['chosen_assisted']}, best {row['best_assisted']}, regret {row['regret_assisted']:.2f})",
                flush=True,
            )
    finally:
        await runner.close()
    summary = summarise(rows)
    if args.out:
        write_report(rows, summary, Path(args.out), args)
    return {"summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 scenarios (two RTTs x cold/warm), for the test suite")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="requests per cloud plan before measuring a scenario")
    ap.add_argument("--quality-floor", type=float, default=0.0)
    ap.add_argument("--busy-clients", type=int, default=12)
    ap.add_argument("--out", default="docs/planner")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = asyncio.run(main_async(args))
    s = res["summary"]
    print(
        json.dumps(res, indent=1)
        if args.json
        else f"median |pred-meas|/meas {100 * s['median_abs_error']:.1f}% (goal <= 20%); regret <= 1.10 in "
        f"{100 * s['regret_ok_fraction']:.0f}% of {s['scenarios']} scenarios (goal >= 90%); split vs cloud: "
        f"{100 * s['assisted_regret_ok_fraction']:.0f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
