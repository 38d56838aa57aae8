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
from collections import Counter
from pathlib import Path

from benchmarks.load_stats import WORK_KEYS

BASELINES = ("vllm-greedy", "vllm-repair", "vllm-resample", "vllm-ngram", "vllm-best-of-5", "cloud")
"""What split is weighed against (issue 53): plain vLLM, plain vLLM with coinfer's checkers after it, vLLM's own
speculation, best-of-5, and coinfer's cloud plan (no drafts)."""
RATIOS = (
    ("split / best baseline", "split", BASELINES),
    ("split / cloud", "split", ("cloud",)),
    ("split / vllm-greedy", "split", ("vllm-greedy",)),
    ("split / vllm-resample", "split", ("vllm-resample",)),
    ("cloud / vllm-greedy", "cloud", ("vllm-greedy",)),
    ("auto / best of split, cloud", "auto", ("split", "cloud")),
    ("auto / best of split, cloud, every answer at the SLO", "auto", ("split", "cloud"), "capacity_rps"),
    ("A/A: vllm-repair / vllm-greedy", "vllm-repair", ("vllm-greedy",)),
)
"""(name, numerator, systems whose best capacity is the denominator: a run has the ratio where it measured them
all[, the capacity read]). Capacities are the cloud's (``cloud_capacity_rps``: answers the edge gave alone are not
cloud capacity), except in the ratio that reads ``capacity_rps``: the requests a second the whole system answered
within the SLO, the edge's own answers included. Auto is read both ways, because it may answer at the edge: where it
did (arith, 2026-12-07, seed 13: 81% of answers, 261 requests a second within the SLO against split's 82.5), the
cloud's share of its rate (50) is no measure of the cloud's limit, which auto never reached. The
last is nearly an A/A ratio: the two systems send the server the same requests; they differ in the checkers' few ms in
the client after each answer and in running second on a server the first warmed. Its spread is mostly the
measurement's own noise: a floor under every other ratio's."""


def _capacity(entry: dict, key: str = "cloud_capacity_rps") -> float:
    """A system's capacity in one run: the cloud's (``key``'s default) where the run reported it, else every answer's."""
    return entry.get(key, entry["capacity_rps"])


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


def _optional(values: list) -> dict | None:
    """``_spread`` of the values given (None where no run had one)."""
    got = [v for v in values if v is not None]
    return _spread(got) if got else None


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
            row["systems"][s] = _spread([_capacity(g) for g in got]) | {
                "lower_bound": any(g.get("capacity_lower_bound") for g in got),
                "accuracy": _optional([g.get("accuracy") for g in got]),
                "edge_only_share": _optional([g.get("edge_only_share") for g in got]),
                "cpu_s_per_answer_at_common_rate": _optional(
                    [(g.get("at_common_rate") or {}).get("cpu_s_per_answer") for g in got]
                ),
                "work_per_answer": {
                    k: statistics.median(v)
                    for k in WORK_KEYS
                    if (v := [g["work_per_answer"][k] for g in got if k in (g.get("work_per_answer") or {})])
                },
            }
        for name, num, dens, *key in RATIOS:
            if got := _ratio(per, num, dens, *key):
                row["ratios"][name] = got
        out[wl] = row
    return out


def _ratio(per: list[dict], num: str, dens: tuple[str, ...], key: str = "cloud_capacity_rps") -> dict | None:
    """``num``'s capacity (``key``) over the best of ``dens`` in each run that has them, summarised (None: no run
    had them). The best baseline is the best of those the run measured (a run of a few systems has fewer to beat,
    so which won is reported); a ratio of named denominators needs them all."""
    vals, won = [], Counter()
    for p in per:
        present = [d for d in dens if d in p]
        if num not in p or not present or (dens is not BASELINES and len(present) < len(dens)):
            continue
        best = max(present, key=lambda d: _capacity(p[d], key))
        if _capacity(p[best], key) > 0:
            vals.append(_capacity(p[num], key) / _capacity(p[best], key))
            won[best] += 1
    if not vals:
        return None
    return _spread(vals) | ({"against": dict(won)} if dens is BASELINES else {})


def table(summary: dict) -> str:
    """The summary as markdown: capacities, then ratios, each as median [min, max] over n runs."""

    def fmt(x: dict, lb: bool = False) -> str:
        return f"{'>= ' if lb else ''}{x['median']:g} [{x['min']:g}, {x['max']:g}] (n={x['runs']})"

    rows = [
        "| workload | system | cloud capacity at the SLO, answers/s | accuracy | edge-only share "
        "| cloud CPU-s / answer at the common rate | engine work / answer: requests, computed prefill "
        "(scored), decoded, steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for wl, row in summary.items():
        for s, x in row["systems"].items():
            opt = [fmt(x[k]) if x.get(k) else "-" for k in ("accuracy", "edge_only_share")]
            cpu = fmt(x["cpu_s_per_answer_at_common_rate"]) if x.get("cpu_s_per_answer_at_common_rate") else "-"
            w = x.get("work_per_answer") or {}
            work = (
                f"{w.get('engine_requests', '-')}, {_computed(w)} ({w.get('scored_tokens', '-')}), "
                f"{w.get('decoded_tokens', '-')}, {w.get('steps', '-')}"
                if w
                else "-"
            )
            rows.append(f"| {wl} | {s} | {fmt(x, x['lower_bound'])} | {' | '.join(opt)} | {cpu} | {work} |")
    rows += ["", "| workload | ratio, within each run | median [min, max] |", "|---|---|---|"]
    for wl, row in summary.items():
        for name, x in row["ratios"].items():
            against = ", ".join(f"{s} {n}" for s, n in x.get("against", {}).items())
            rows.append(f"| {wl} | {name}{f' (the best: {against})' if against else ''} | {fmt(x)} |")
    return "\n".join(rows)


def _computed(w: dict) -> str:
    """Prompt positions computed (past the prefix cache), or '-' where the cache's hits were not reported."""
    if "prompt_tokens" not in w or "cached_tokens" not in w:
        return "-"
    return f"{w['prompt_tokens'] - w['cached_tokens']:g}"


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
