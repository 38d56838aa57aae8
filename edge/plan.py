"""``python -m coinfer.edge.plan``: which plan would this request get, and why.

    python -m coinfer.edge.plan --model DRAFT_DIR --cloud HOST:PORT --prompt "If x=3 and y=5, compute x*y." --explain
    python -m coinfer.edge.plan ... --edge-state cold --json

Calibrates first (disk, PCIe, decode steps by batch size, network RTT / bandwidth via the
Probe RPC, cloud queue via Status; or loads ``--calibration FILE`` and skips probing with
``--no-probe``), then prints each plan's predicted breakdown, the choice and the reason, and
which numbers are defaults or were refused as absurd.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys

from coinfer.edge.config import EdgeConfig
from coinfer.edge.planner.planner import EdgeState
from coinfer.edge.service import EdgeCore, infer_task
from coinfer.errors import CoinferError
from coinfer.types import ModelState


async def explain(args) -> dict:
    cfg = EdgeConfig(
        model=args.model,
        cloud=args.cloud or "",
        token=args.token or "",
        tls_ca=args.tls_ca or "",
        grpc_port=-1,
        http_port=-1,
        planner_state=args.calibration or "",
        quality_floor=args.quality_floor,
        probe_on_start=not args.no_probe,
        allow_unverified=args.allow_unverified,
    )
    core = EdgeCore(cfg)
    try:
        await core.start()
        probed = list(core.planner.est.means())
        task = args.task or infer_task(args.prompt) or "open"  # open requests: their own estimates
        state = core.edge_state()
        if args.edge_state != "auto":
            state = EdgeState(model_bytes=state.model_bytes, state=ModelState(args.edge_state), gpu=state.gpu)
        n = args.num_drafts or core.link.recommended_drafts
        cloud_ok = core.link.enabled and core.link.serving
        size = core.planner.prompt_size(args.prompt)
        choice = core.planner.choose(task=task, size=size, n=n, edge=state, cloud_available=cloud_ok)
        shape = dataclasses.asdict(core.planner.shape(task=task, size=size, n=n))
        return {
            "task": task,
            "shape": shape,
            "num_drafts": n,
            "edge_state": state.state,
            "model_bytes": state.model_bytes,
            "cloud": {"configured": core.link.enabled, "serving": core.link.serving},
            "chosen": choice.plan,
            "reason": choice.reason,
            "plans": {p: b.as_dict() for p, b in choice.breakdowns.items()},
            "estimates": dict(sorted(core.planner.est.means().items())),
            "measured_keys": sorted(probed),
            "notes": list(choice.notes),
        }
    finally:
        await core.close()


def _work(tokens: float | None) -> str:
    """Engine tokens per answer the cloud reported for the plan ("-": never reported)."""
    return "-" if tokens is None else f"{tokens:.0f}"


def render(r: dict) -> str:
    lines = [
        f"task {r['task']}, {r['num_drafts']} drafts, edge model {r['edge_state']} "
        f"({r['model_bytes'] / 1e6:.1f} MB), cloud {'serving' if r['cloud']['serving'] else 'unavailable'}",
        "",
        f"{'plan':<6} {'cold start':>10} {'drafting':>9} {'transfer':>9} {'cloud':>8} {'escalate':>9} "
        f"{'total ms':>9} {'quality':>8} {'cloud tok':>9}",
    ]
    for p, b in sorted(r["plans"].items(), key=lambda kv: kv[1]["total_ms"]):
        mark = " <- chosen" if p == r["chosen"] else ""
        # escalate: auto's edge answer failing the rules goes to a split (its chance times its cost);
        # cloud tok: what the plan costs the cloud per answer as the cloud reports it (Summary.cost)
        lines.append(
            f"{p:<6} {b['cold_start_ms']:>10.1f} {b['drafting_ms']:>9.1f} {b['transfer_ms']:>9.1f} "
            f"{b['cloud_ms']:>8.1f} {b['escalation_ms']:>9.1f} {b['total_ms']:>9.1f} {b['quality']:>8.2f} "
            f"{_work(b['cloud_work']):>9}{mark}"
        )
    sh = r["shape"]
    lines += [
        "",
        f"expected (history): drafts of {sh['draft_tokens']} tokens, {sh['rounds']:.2f} draft rounds per "
        f"split, cloud decode steps {sh['split_steps']:.0f} refining / {sh['cloud_steps']:.0f} alone, "
        f"answer {sh['answer_tokens']} tokens",
    ]
    lines += ["", f"why: {r['reason']}"]
    if r["notes"]:
        lines += ["", "caveats:"] + [f"  - {n}" for n in r["notes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coinfer.edge.plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="draft model directory (quantize-CLI artefact)")
    ap.add_argument("--cloud", help="cloud host:port (omit: edge only)")
    ap.add_argument("--token")
    ap.add_argument("--tls-ca")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--task", help="default: inferred from the prompt")
    ap.add_argument("--num-drafts", type=int, default=0)
    ap.add_argument(
        "--edge-state",
        choices=("auto", "cold", "loading", "warm"),
        default="auto",
        help="plan as if the edge model were in this state (auto: as it is after start)",
    )
    ap.add_argument("--quality-floor", type=float, default=0.0)
    ap.add_argument("--calibration", help="planner calibration file to read (and update)")
    ap.add_argument("--no-probe", action="store_true", help="use the calibration file / defaults only")
    ap.add_argument("--allow-unverified", action="store_true")
    ap.add_argument("--explain", action="store_true", help="print every plan's breakdown (default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        r = asyncio.run(explain(args))
    except (ValueError, CoinferError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(r, indent=2) if args.json else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
