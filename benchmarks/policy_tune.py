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
cloud tokens per answer of each, per task, so the defaults in ``cloud.config.PolicyConfig`` are
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


def train_cases(kinds: tuple[str, ...], per_kind: int, seed: int) -> list[Case]:
    from demo.train import sample_item

    rng = random.Random(seed)
    return [Case(k, (it := sample_item(rng, k, held_out=False)).question, it) for k in kinds for _ in range(per_kind)]


async def _record(case: Case, edge, engine, i: int) -> dict:
    from cloud.engine import GenParams
    from coinfer.chat import ChatMessage, refine_question, with_question
    from coinfer.rules import RuleSet
    from coinfer.tasks import get_task
    from edge.sampling import Sampling

    conv = [ChatMessage("user", case.prompt)]
    task = get_task(case.task)
    rules = RuleSet(case.rules(), task, task.parse_problem(case.prompt), extraction=case.extraction())
    drafts = await asyncio.to_thread(edge.generate, edge.render(conv), Sampling(n=5, seed=1000 + i, presence_penalty=0.0, frequency_penalty=0.0))
    prompt = engine.render(conv)
    rows = []
    for d in drafts:
        res, parsed = rules.check(d.text)
        lps = await engine.continuation_logprobs(prompt, d.text, f"p{i}-{d.index}") if res.valid else []
        rows.append({"text": d.text, "valid": res.valid, "correct": case.grade(d.text), "tokens": d.num_tokens,
                     "key": str(task.answer_key(parsed)) if res.valid else None,
                     "mean_lp": sum(lps) / len(lps) if lps else None, "min_lp": min(lps) if lps else None})

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
        refined = {"correct": case.grade(text), "tokens": toks}
    return {"kind": case.kind, "drafts": rows, "greedy": {"correct": case.grade(greedy), "tokens": greedy_toks},
            "refined": refined}


async def collect(per_kind: int, seed: int, out: Path) -> None:
    from cloud.config import EngineConfig
    from cloud.engine import VllmEngine
    from demo.artifacts import ensure_artifacts
    from edge.draft_engine import OrtDraftEngine

    art = ensure_artifacts()
    engine = await VllmEngine(EngineConfig(model=str(art.target))).start()
    edge = OrtDraftEngine(art.draft_int8)
    try:
        with out.open("w") as f:
            for i, case in enumerate(train_cases(KINDS, per_kind, seed)):
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
                row[kind] = {"acc": round(sum(c for c, _, _ in rs) / n, 3), "tokens": round(sum(t for _, t, _ in rs) / n, 1),
                             "from_drafts": round(sum(m != "alone" for _, _, m in rs) / n, 3)}
        out.append(row)
    return out


def baselines(recs: list[dict]) -> dict:
    out = {}
    for kind in KINDS:
        rs = [r for r in recs if r["kind"] == kind]
        if rs:
            n = len(rs)
            out[kind] = {"greedy_acc": round(sum(r["greedy"]["correct"] for r in rs) / n, 3),
                         "greedy_tokens": round(sum(r["greedy"]["tokens"] for r in rs) / n, 1),
                         "first_draft_acc": round(sum(r["drafts"][0]["correct"] for r in rs) / n, 3),
                         "any_draft": round(sum(any(d["correct"] for d in r["drafts"]) for r in rs) / n, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collect", type=int, default=0, help="train-side problems per task to record")
    ap.add_argument("--out", type=Path, default=Path("policy.jsonl"))
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--simulate", type=Path, help="replay a recording under a grid of policies")
    args = ap.parse_args(argv)
    if args.collect:
        asyncio.run(collect(args.collect, args.seed, args.out))
    if args.simulate:
        recs = load(args.simulate)  # read once for both
        print(json.dumps({"baselines": baselines(recs), "grid": simulate(recs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
