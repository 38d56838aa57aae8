"""Several ``benchmarks.capacity`` runs as one table: per workload and system the median capacity and its range,
and the ratios a claim rests on (each plan over vLLM greedy, split over the cloud plan, auto over the better single
plan), each taken per run and then summarised, never from medians of their parts.

    .venv/bin/python -m benchmarks.capacity_runs docs/capacity/2026-12-06-auto-measured-centre-seed*.json [--json]

Each file is one run's ``--json`` report (the last line of its stdout). A ratio is reported only over the runs
that measured both of its systems; a capacity marked a lower bound in any run is marked ">=" in the table. Pure:
reads files, prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

RATIOS = (
    ("split / vllm-greedy", "split", ("vllm-greedy",)),
    ("cloud / vllm-greedy", "cloud", ("vllm-greedy",)),
    ("split / cloud", "split", ("cloud",)),
    ("auto / best of split, cloud", "auto", ("split", "cloud")),
)
"""(name, numerator, systems whose best capacity is the denominator)."""


def load(paths: list[Path]) -> list[dict]:
    """Each run's report: the file's last non-empty line, parsed."""
    runs = []
    for p in paths:
        lines = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"{p}: empty")
        runs.append(json.loads(lines[-1]))
    return runs


def _spread(values: list[float]) -> dict:
    return {
        "runs": len(values),
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarise(runs: list[dict]) -> dict:
    """Per workload: each system's capacity (median, range, lower bound in any run) and accuracy, and each ratio of
    ``RATIOS`` taken within every run that has its systems."""
    out: dict = {}
    for wl in sorted({w for r in runs for w in r["workloads"]}):
        per = [r["workloads"][wl] for r in runs if wl in r["workloads"]]
        systems = sorted({s for p in per for s in p})
        row: dict = {"systems": {}, "ratios": {}}
        for s in systems:
            got = [p[s] for p in per if s in p]
            row["systems"][s] = _spread([g["capacity_rps"] for g in got]) | {
                "lower_bound": any(g.get("capacity_lower_bound") for g in got),
                "accuracy": _spread([g["accuracy"] for g in got if g.get("accuracy") is not None])
                if any(g.get("accuracy") is not None for g in got)
                else None,
            }
        for name, num, dens in RATIOS:
            vals = [
                p[num]["capacity_rps"] / best
                for p in per
                if num in p and all(d in p for d in dens) and (best := max(p[d]["capacity_rps"] for d in dens)) > 0
            ]
            if vals:
                row["ratios"][name] = _spread(vals)
        out[wl] = row
    return out


def table(summary: dict) -> str:
    """The summary as markdown: capacities, then ratios, each as median [min, max] over n runs."""

    def fmt(x: dict, lb: bool = False) -> str:
        return f"{'>= ' if lb else ''}{x['median']:g} [{x['min']:g}, {x['max']:g}] (n={x['runs']})"

    rows = ["| workload | system | capacity at the SLO, answers/s | accuracy |", "|---|---|---|---|"]
    for wl, row in summary.items():
        for s, x in row["systems"].items():
            acc = fmt(x["accuracy"]) if x["accuracy"] else "-"
            rows.append(f"| {wl} | {s} | {fmt(x, x['lower_bound'])} | {acc} |")
    rows += ["", "| workload | ratio, within each run | median [min, max] |", "|---|---|---|"]
    for wl, row in summary.items():
        for name, x in row["ratios"].items():
            rows.append(f"| {wl} | {name} | {fmt(x)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="benchmarks.capacity --json outputs, one run each")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = ap.parse_args(argv)
    summary = summarise(load(args.reports))
    print(json.dumps(summary) if args.json else table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
