"""Fault campaign: real processes and engines, faults injected, one command.

    python -m benchmarks.faults [--short] [--out docs/faults] [--hostile-examples 10000]

The command line of ``scenarios.faults`` (the scenario code, which the tests import too); what it
runs and reports is described there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from scenarios.faults import Campaign, Sizes, write_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="the CI form: fewer edges, shorter load, fewer clients")
    ap.add_argument("--out", type=Path, default=Path("docs/faults"), help="report directory")
    ap.add_argument(
        "--hostile-examples",
        type=int,
        default=0,
        help="also run benchmarks.hostile with this many inputs per target (0: skip)",
    )
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="coinfer-faults-"))
    report = asyncio.run(Campaign(Sizes.short() if args.short else Sizes(), work).run(args.hostile_examples))
    report["logs"] = str(work)
    write_report(report, args.out)
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
