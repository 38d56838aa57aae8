"""Pictures of ``benchmarks.capacity`` runs: one PNG per workload, p95 latency against offered rate (one line per
system and run, each run's p95 over that run's own SLO, so the SLO is the line at 1) beside the engine's work per answer as stacked bars (prefill computed to
score a text / other prefill computed / decoded; the median over the runs).

    .venv/bin/python -m benchmarks.capacity_plots docs/capacity/RUN*.json --out docs/capacity/plots

Each file is one run's ``--json`` report (``benchmarks.capacity_runs.load``). Reads files, writes PNGs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks.capacity_runs import load

PARTS = ("prefill, scored", "prefill", "decode")
"""The stacked bars' parts: prompt positions computed to score a text (a draft's check), the other computed ones
(past the prefix cache), the tokens decoded."""


def work_parts(work: dict) -> tuple[float, float, float] | None:
    """``PARTS`` of one ``work_per_answer`` (None: the server counted no prompt or decode)."""
    if "prompt_tokens" not in work or "decoded_tokens" not in work:
        return None
    computed = work["prompt_tokens"] - work.get("cached_tokens", 0)
    scored = work.get("scored_tokens", 0)
    return scored, computed - scored, work["decoded_tokens"]


def plot(runs: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for wl in sorted({w for r in runs for w in r["workloads"]}):
        per = [r for r in runs if wl in r["workloads"]]
        systems = sorted({s for r in per for s in r["workloads"][wl]})
        fig, (lat, bars) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
        colors = {s: plt.cm.tab10(i % 10) for i, s in enumerate(systems)}
        for s in systems:
            for i, r in enumerate(per):
                entry = r["workloads"][wl].get(s)
                if entry is None:
                    continue
                slo = r["slo_s"][wl]
                pts = sorted((st["rate"], st["p95_s"] / slo) for st in entry["steps"])
                first = not any(s in q["workloads"][wl] for q in per[:i])
                lat.plot(*zip(*pts, strict=True), "o-", color=colors[s], alpha=0.8, ms=3, label=s if first else None)
        slos = ", ".join(f"{r['slo_s'][wl]:.2f}" for r in per)
        lat.axhline(1.0, color="k", ls="--", lw=1, label=f"SLO (each run's: {slos} s)")
        lat.set(xscale="log", yscale="log", xlabel="offered rate, requests/s", ylabel="p95 latency / the run's SLO")
        lat.set_title(f"{wl}: p95 latency against offered rate ({len(per)} runs)")
        lat.legend(fontsize=8)
        bottoms = [0.0] * len(systems)
        medians = []
        for s in systems:
            got = [
                p for r in per if (e := r["workloads"][wl].get(s)) and (p := work_parts(e.get("work_per_answer") or {}))
            ]
            medians.append(tuple(statistics.median(x[j] for x in got) for j in range(3)) if got else (0.0, 0.0, 0.0))
        for j, part in enumerate(PARTS):
            vals = [m[j] for m in medians]
            bars.bar(range(len(systems)), vals, bottom=bottoms, label=part)
            bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
        bars.set_xticks(range(len(systems)), systems, rotation=35, ha="right", fontsize=8)
        bars.set(ylabel="target tokens computed per answer (median over runs)")
        bars.set_title("engine work per answer, as the servers count it")
        bars.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{wl}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="benchmarks.capacity --json outputs, one run each")
    ap.add_argument("--out", type=Path, default=Path("docs/capacity/plots"))
    args = ap.parse_args(argv)
    for p in plot(load(args.reports), args.out):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
