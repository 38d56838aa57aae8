"""Tune the cloud's refinement policy on the *train* side of the demo's problems, offline.

Usage::

    .venv/bin/python -m benchmarks.policy_tune --collect 60 --out /tmp/policy.jsonl   # ~10 min on 2 cores
    .venv/bin/python -m benchmarks.policy_tune --simulate /tmp/policy.jsonl

``--collect`` runs the real parts once per problem (never a held-out one): the edge's INT8 draft
writes 5 drafts (ONNX Runtime, the daemon's sampling), the request's rules check each, the target
(vLLM) scores each draft's tokens (prompt logprobs: mean and minimum), answers alone (greedy) and
refines the two best valid drafts as candidates (greedy). ``--simulate`` replays the recorded
outcomes under a grid of policies -- accept the best verified draft as is when its score and the
drafts' agreement reach thresholds, else refine, else the cloud alone -- and prints accuracy and
cloud tokens per answer of each, per task, so the defaults in ``coinfer.cloud.config.PolicyConfig`` are
chosen from measurements that never saw the held-out problems ``benchmarks.open_accuracy`` reports.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
from collections import Counter
from pathlib import Path

from benchmarks.open_accuracy import KINDS, Case


def train_cases(kinds: tuple[str, ...], per_kind: int, seed: int, held_out: bool = False) -> list[Case]:
    from coinfer.demo.train import sample_item

    rng = random.Random(seed)
    return [
        Case(k, (it := sample_item(rng, k, held_out=held_out)).question, it) for k in kinds for _ in range(per_kind)
    ]


async def _record(case: Case, edge, engine, i: int) -> dict:
    from coinfer.chat import ChatMessage, refine_question, with_question
    from coinfer.cloud.engine import GenParams
    from coinfer.edge.sampling import Sampling
    from coinfer.rules import RuleSet
    from coinfer.tasks import get_task

    conv = [ChatMessage("user", case.prompt)]
    task = get_task(case.task)
    rules = RuleSet(case.rules(), task, task.parse_problem(case.prompt), extraction=case.extraction())
    drafts = await asyncio.to_thread(
        edge.generate, edge.render(conv), Sampling(n=5, seed=1000 + i, presence_penalty=0.0, frequency_penalty=0.0)
    )
    prompt = engine.render(conv)
    rows = []
    for d in drafts:
        res, parsed = rules.check(d.text)
        lps = await engine.continuation_logprobs(prompt, d.text, f"p{i}-{d.index}") if res.valid else []
        rows.append(
            {
                "text": d.text,
                "valid": res.valid,
                "correct": case.grade(d.text),
                "tokens": d.num_tokens,
                "key": str(task.answer_key(parsed)) if res.valid else None,
                "mean_lp": sum(lps) / len(lps) if lps else None,
                "min_lp": min(lps) if lps else None,
                "own_lp": d.mean_logprob,
            }
        )

    async def gen(p: str, tag: str) -> tuple[str, int]:
        text, toks = "", 0
        async for c in engine.generate(p, GenParams(max_tokens=256), f"p{i}-{tag}"):
            text, toks = text + c.text, toks + c.tokens
        return text, toks

    greedy, greedy_toks = await gen(prompt, "g")
    ranked = sorted((r for r in rows if r["valid"]), key=lambda r: -(r["mean_lp"] or -1e9))
    refined = None
    if ranked:
        q = refine_question(case.prompt, [r["text"] for r in ranked[:2]])
        text, toks = await gen(engine.render(with_question(conv, q)), "r")
        res, parsed = rules.check(text)
        lps = await engine.continuation_logprobs(prompt, text, f"p{i}-rl")
        refined = {
            "correct": case.grade(text),
            "tokens": toks,
            "valid": res.valid,
            "key": str(task.answer_key(parsed)) if res.valid else None,
            "mean_lp": sum(lps) / len(lps) if lps else None,
        }
    return {
        "kind": case.kind,
        "drafts": rows,
        "greedy": {"correct": case.grade(greedy), "tokens": greedy_toks},
        "refined": refined,
    }


async def collect(per_kind: int, seed: int, out: Path, held_out: bool = False) -> None:
    from coinfer.cloud.config import EngineConfig
    from coinfer.cloud.vllm_engine import VllmEngine
    from coinfer.demo.artifacts import ensure_artifacts
    from coinfer.edge.draft_engine import OrtDraftEngine

    art = ensure_artifacts()
    engine = await VllmEngine(EngineConfig(model=str(art.target))).start()
    edge = OrtDraftEngine(art.draft_int8)
    try:
        with out.open("w") as f:
            for i, case in enumerate(train_cases(KINDS, per_kind, seed, held_out)):
                f.write(json.dumps(await _record(case, edge, engine, i)) + "\n")
                f.flush()
    finally:
        await engine.close()


def simulate_one(rec: dict, accept_score: float, accept_agree: float, accept_min_lp: float) -> tuple[bool, int, str]:
    """(correct, cloud tokens, mode) of one recorded problem under a policy."""
    valid = [d for d in rec["drafts"] if d["valid"]]
    if not valid:
        return rec["greedy"]["correct"], rec["greedy"]["tokens"], "alone"
    votes = Counter(d["key"] for d in valid)
    best = max(valid, key=lambda d: d["mean_lp"] + 0.3 * votes[d["key"]] / len(valid))
    agree = votes[best["key"]] / len(valid)
    if math.exp(best["mean_lp"]) >= accept_score and agree >= accept_agree and best["min_lp"] >= accept_min_lp:
        return best["correct"], 0, "accepted"
    return rec["refined"]["correct"], rec["refined"]["tokens"], "candidates"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def simulate(recs: list[dict]) -> list[dict]:
    out = []
    grid = itertools.product((0.0, 0.8, 0.9, 0.95, 0.98, 1.01), (0.0, 0.4, 0.6, 0.8), (-99.0, -8.0, -5.0, -3.0, -2.0))
    for score, agree, min_lp in grid:
        row = {"accept_score": score, "accept_agree": agree, "accept_min_lp": min_lp}
        for kind in KINDS:
            rs = [simulate_one(r, score, agree, min_lp) for r in recs if r["kind"] == kind]
            if rs:
                n = len(rs)
                row[kind] = {
                    "acc": round(sum(c for c, _, _ in rs) / n, 3),
                    "tokens": round(sum(t for _, t, _ in rs) / n, 1),
                    "from_drafts": round(sum(m != "alone" for _, _, m in rs) / n, 3),
                }
        out.append(row)
    return out


def refinement_guard(recs: list[dict], override_nats: float = 0.2) -> dict:
    """The refinement guard's measure: where >= 2 valid drafts agree on one answer, how often the refinement turns
    a correct agreed answer wrong (and fixes a wrong one), without the guard and with it (the session
    keeps the drafts' answer when the refinement disagrees and its mean logprob does not beat the best
    draft's by ``override_nats``: ``PolicyConfig.refine_override_nats``)."""
    agreed = broke = fixed = broke_after = fixed_after = 0
    for r in recs:
        valid = [d for d in r["drafts"] if d["valid"]]
        if len(valid) < 2 or len({d["key"] for d in valid}) != 1 or r["refined"] is None:
            continue
        agreed += 1
        ref, drafts_right = r["refined"], valid[0]["correct"]
        best = max(d["mean_lp"] for d in valid)
        kept = ref.get("key") == valid[0]["key"] or (
            ref.get("mean_lp") is not None and ref["mean_lp"] >= best + override_nats
        )
        after = ref["correct"] if kept and ref.get("valid", True) else drafts_right
        broke += drafts_right and not ref["correct"]
        fixed += not drafts_right and ref["correct"]
        broke_after += drafts_right and not after
        fixed_after += not drafts_right and after
    return {
        "agreed": agreed,
        "broke_correct_before": broke,
        "broke_correct_after": broke_after,
        "fixed_wrong_before": fixed,
        "fixed_wrong_after": fixed_after,
    }


def own_likelihood(recs: list[dict]) -> dict:
    """The likelihood verifier's inputs on the recorded valid drafts: the target's mean logprob
    (``mean_lp``) and the draft model's own (``own_lp``), for correct and wrong drafts."""
    out = {}
    for label in (True, False):
        ds = [
            d for r in recs for d in r["drafts"] if d["valid"] and d["correct"] is label and d.get("own_lp") is not None
        ]
        if ds:
            med = sorted(ds, key=lambda d: d["mean_lp"])[len(ds) // 2]
            out["correct" if label else "wrong"] = {
                "n": len(ds),
                "median_target": round(med["mean_lp"], 3),
                "median_own": round(sorted(d["own_lp"] for d in ds)[len(ds) // 2], 3),
            }
    return out


def baselines(recs: list[dict]) -> dict:
    out = {}
    for kind in KINDS:
        rs = [r for r in recs if r["kind"] == kind]
        if rs:
            n = len(rs)
            out[kind] = {
                "greedy_acc": round(sum(r["greedy"]["correct"] for r in rs) / n, 3),
                "greedy_tokens": round(sum(r["greedy"]["tokens"] for r in rs) / n, 1),
                "first_draft_acc": round(sum(r["drafts"][0]["correct"] for r in rs) / n, 3),
                "any_draft": round(sum(any(d["correct"] for d in r["drafts"]) for r in rs) / n, 3),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collect", type=int, default=0, help="train-side problems per task to record")
    ap.add_argument("--out", type=Path, default=Path("policy.jsonl"))
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--simulate", type=Path, help="replay a recording under a grid of policies")
    ap.add_argument(
        "--held-out",
        action="store_true",
        help="record held-out problems (to measure, never to tune: the grid is for train-side recordings)",
    )
    ap.add_argument("--json", action="store_true", help="print the whole report (the grid too) as JSON")
    args = ap.parse_args(argv)
    if args.collect:
        asyncio.run(collect(args.collect, args.seed, args.out, args.held_out))
    if args.simulate:
        recs = load(args.simulate)  # read once for both
        report = {
            "baselines": baselines(recs),
            "refinement_guard": refinement_guard(recs),
            "likelihood": own_likelihood(recs),
            "grid": simulate(recs),
        }
        print(
            json.dumps(report) if args.json else json.dumps({k: v for k, v in report.items() if k != "grid"}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
