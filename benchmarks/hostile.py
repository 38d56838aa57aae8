"""Hostile inputs, generated: a hypothesis-driven fuzz campaign against every RPC and
endpoint of a real cloud (vLLM) and a real edge daemon (ONNX Runtime drafts, gRPC + HTTP).

    .venv/bin/python -m benchmarks.hostile [--examples 10000] [--seed 0] [--out docs/faults/hostile.json]

The command line of ``scenarios.hostile`` (the scenario code, which the tests import too); what it
runs and reports is described there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from scenarios.hostile import campaign, summary, targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=10_000, help="generated inputs per target")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (the inputs are reproducible by it)")
    ap.add_argument("--out", type=Path, help="write the JSON report here (e.g. docs/faults/hostile.json)")
    ap.add_argument("--targets", default="", help="comma-separated subset, e.g. cloud.Session,http.chat")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight per target")
    ap.add_argument("--timeout", type=float, default=60.0, help="client deadline per request (s): past it, a hang")
    args = ap.parse_args(argv)
    names = [t.name for t in targets()]
    only = [x for x in args.targets.split(",") if x]
    if set(only) - set(names):
        ap.error(f"unknown target(s) {sorted(set(only) - set(names))}; known: {', '.join(names)}")
    report = asyncio.run(campaign(args.examples, args.seed, only, args.concurrency, args.timeout))
    print(summary(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    ok = (
        not report["failure"]
        and not report["crashes"]
        and all(v.startswith("ok") for v in report["alive_after"].values())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
