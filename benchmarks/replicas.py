"""Many edges, many cloud replicas, and faults during a bounded load run.

    .venv/bin/python -m benchmarks.replicas [--replicas 3] [--edges 4] [--requests 300] [--concurrency 8] [--json]

The command line of ``scenarios.replicas`` (the scenario code, which the tests import too); what it
runs and reports is described there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from scenarios.replicas import Scenario, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Scenario()
    for f in ("replicas", "edges", "requests", "concurrency"):
        ap.add_argument(f"--{f}", type=int, default=getattr(d, f))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/coinfer-replicas"))
    args = ap.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    sc = Scenario(replicas=args.replicas, edges=args.edges, requests=args.requests, concurrency=args.concurrency)
    out = asyncio.run(run(sc, args.log_dir))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
