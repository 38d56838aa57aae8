"""Hostile inputs, generated: a hypothesis-driven fuzz campaign against every RPC and
endpoint of a real cloud (vLLM) and a real edge daemon (ONNX Runtime drafts, gRPC + HTTP).

    .venv/bin/python -m benchmarks.hostile [--examples 10000] [--seed 0] [--out docs/faults/hostile.json]

Each target gets ``--examples`` inputs from hypothesis strategies (reproducible by ``--seed``):
protobuf messages built from the descriptors (extreme and random field values, NaN / inf, unknown
enum numbers, huge / empty / control-character strings, repeated fields of thousands of entries), the
same at the wire level (invalid UTF-8 and surrogates in string fields, overlong varints, wrong wire
types, truncated and foreign serialisations, garbage), near-valid requests with hostile payloads
where the parsers look (prompts that backtracked, 1,000-term sums, deep JSON, 5,000-digit numbers,
client regexes and JSON Schemas that explode, oversized messages), and HTTP bodies (random JSON
shapes, wrong types, invalid UTF-8, lone surrogates, non-JSON, deep nesting, hostile ``coinfer``
extras). A valid value of a costly knob (token budget, deadline) is mapped into a cheap one: the
campaign tests input handling, not generation speed.

Every answer is classified: for client input, gRPC INTERNAL / UNKNOWN and HTTP 5xx are failures (503
and UNAVAILABLE are noted: they are right only while the server truly is unavailable), and so are a
message that leaks a filesystem path, a Python class or exception name or a traceback (an echo of
the request's own text aside), no answer within the client's deadline, and a dropped connection or a
cut event stream. Meanwhile a separate process calls the cloud's Status, the edge's Status and
``/healthz`` every 20 ms: a request that holds a serving event loop shows there (the requirement: p99
< 50 ms), per target too. At the end both servers must still be running and answer a normal request.

``tests/integration/test_hostile_fuzz.py`` runs the same generators and classifier, briefly.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

from scenarios.hostile.liveness import Prober, alive, probe_report
from scenarios.hostile.servers import Servers
from scenarios.hostile.stalls import ON_CPU_MS, stall_report
from scenarios.hostile.targets import Clients, Tally, run_target, targets

STACK_LINES_SHOWN = 6
"""Of each kept stall's stack, the summary prints the last lines: the innermost three frames (the report has it all)."""

# ---- the campaign ---------------------------------------------------------------------------------------


async def campaign(examples: int, seed: int, only: list[str], concurrency: int, timeout: float) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="coinfer-hostile-"))
    t_start = time.perf_counter()
    servers = await Servers.start(logs)
    ep = servers.endpoints
    print(
        f"cloud {ep.cloud}, edge gRPC {ep.edge_grpc}, HTTP {ep.edge_http} up in "
        f"{time.perf_counter() - t_start:.0f} s; logs in {logs}",
        flush=True,
    )
    tally = Tally()
    chosen = [t for t in targets() if not only or t.name in only]
    try:
        with Prober(ep) as prober:
            clients = Clients(ep)
            t0, windows = time.perf_counter(), {}
            try:
                for target in chosen:
                    start = time.time()
                    await run_target(target, clients, examples, seed, tally, concurrency, timeout)
                    windows[target.name] = (start, time.time())
                    c = tally.counts.get(target.name, Counter())
                    print(
                        f"  {target.name:<24} {sum(c.values()):>6} in {tally.seconds[target.name]:7.1f} s  "
                        f"{dict(c.most_common(6))}",
                        flush=True,
                    )
            finally:
                await clients.close()
            wall = time.perf_counter() - t0
            probes = probe_report(*prober.finish(), windows)
        after = await alive(ep)
        codes = servers.exit_codes()
    finally:
        servers.stop()
    stalls = {name: stall_report(_read(logs / f"{name}.log"), windows) for name in ("cloud", "edge")}
    sent = sum(sum(c.values()) for c in tally.counts.values())
    return {
        "seed": seed,
        "examples_per_target": examples,
        "concurrency": concurrency,
        "wall_s": round(wall, 1),
        "examples": sent,
        "examples_per_s": round(sent / wall, 1),
        "probes": probes,
        "loop_stalls": stalls,
        "alive_after": after,
        "crashes": sum(code is not None for code in codes.values()),
        "exit_codes": codes,
        "logs": str(logs),
        **tally.report(),
    }


def _read(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except FileNotFoundError:
        return ""


async def run(
    examples: int, seed: int = 0, only: list[str] | None = None, concurrency: int = 4, timeout: float = 60.0
) -> dict:
    """The campaign's report, for another benchmark (``benchmarks.faults --hostile-examples``)."""
    return await campaign(examples, seed, only or [], concurrency, timeout)


def _stall_lines(stalls: dict) -> list[str]:
    """The servers' own loop-stall warnings (coinfer.serving.loopwatch), while the targets ran."""
    threshold = next((s["threshold_ms"] for s in stalls.values() if s.get("threshold_ms") is not None), 50)
    lines = [
        f"\nevent-loop stalls the servers logged while the targets ran (loop held > {threshold:.0f} ms);",
        "  a stall with little on-CPU time is the loop waiting for a core or the GIL, not code holding it:",
    ]
    for name, s in stalls.items():
        lines.append(
            f"  {name:<6} stalls {s['stalls']:>5}  max held {s['max_held_ms']:6.0f} ms  max on CPU "
            f"{s['max_on_cpu_ms']:6.0f} ms  max waiting for a core {s.get('max_queued_ms', 0):6.0f} ms  "
            f"max in GC {s.get('max_gc_ms', 0):6.0f} ms  "
            f"on CPU > {ON_CPU_MS:.0f} ms {s['on_cpu_over_50ms']:>4}  (log lines suppressed: "
            f"{s.get('suppressed', 0)})"
        )
    lines.append(f"  while each target ran, stalls / on CPU > {ON_CPU_MS:.0f} ms of " + ", ".join(stalls) + ":")
    for target in next(iter(stalls.values()), {}).get("by_target", {}):
        lines.append(
            f"    {target:<24} "
            + "  ".join(
                f"{s['by_target'][target]['stalls']:>5} / {s['by_target'][target]['on_cpu_over_50ms']:>3}"
                for s in stalls.values()
            )
        )
    for name, s in stalls.items():
        for x in s["on_cpu_stacks"]:
            lines.append(
                f"  {name}: {x['on_cpu_ms']:.0f} of {x['held_ms']:.0f} ms on CPU at {x['at']} "
                f"({x['target']}), innermost frames:"
            )
            lines.extend(f"    {ln}" for ln in x["stack"].splitlines()[-STACK_LINES_SHOWN:])
    return lines


def summary(report: dict) -> str:
    lines = [f"{'target':<24} {'n':>6} {'s':>7}  codes"]
    for name, t in report["targets"].items():
        lines.append(
            f"{name:<24} {t['examples']:>6} {t['seconds']:>7.1f}  "
            + ", ".join(f"{k} {v}" for k, v in t["codes"].items())
        )
    lines.append(
        f"\n{report['examples']} examples in {report['wall_s']} s ({report['examples_per_s']}/s), seed "
        f"{report['seed']}; crashes {report['crashes']}; after: {report['alive_after']}"
    )
    lines.append("\nliveness (every 20 ms, requirement p99 < 50 ms; the loop lag is the prober's own):")
    for name, p in report["probes"]["overall"].items():
        lines.append(
            f"  {name:<16} n={p.get('n', 0):>6} p50 {p.get('p50_ms', 0):7.2f} p99 {p.get('p99_ms', 0):7.2f} "
            f"max {p.get('max_ms', 0):8.2f} ms  >50ms {p.get('over_50ms', 0)}  errors {p.get('errors')}"
        )
    lines.append("  while each target ran, p99 / max ms of " + ", ".join(report["probes"]["overall"]) + ":")
    for target, by in report["probes"]["by_target"].items():
        lines.append(
            f"    {target:<24} "
            + "  ".join(f"{p.get('p99_ms', 0):6.1f} / {p.get('max_ms', 0):6.1f}" for p in by.values())
        )
    if "loop_stalls" in report:
        lines.extend(_stall_lines(report["loop_stalls"]))
    for kind in ("failure", "unavailable"):
        groups = report[kind]
        lines.append(f"\n{kind}: {sum(g['count'] for g in groups)} in {len(groups)} group(s)")
        for g in sorted(groups, key=lambda g: -g["count"]):
            lines.append(f"  [{g['target']}] {g['what']} x{g['count']}: {g['message'][:160]!r}")
            lines.extend(f"      e.g. {e[:300]}" for e in g["examples"])
    return "\n".join(lines)
