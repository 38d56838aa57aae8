"""What co-inference buys, end to end: accuracy and cloud decode cost of split vs the target alone.

Usage::

    .venv/bin/python -m benchmarks.open_accuracy                  # 100 held-out problems per task
    .venv/bin/python -m benchmarks.open_accuracy --problems 40 --tasks words --json out.json
    .venv/bin/python -m benchmarks.open_accuracy --dtype-check     # only: the target in float32 vs bfloat16

One run, one machine: the cloud service (vLLM, the demo target) on 127.0.0.1 and the edge's
INT8 draft on ONNX Runtime, over gRPC. Three kinds of held-out problem: the presets ``arith``
and ``select`` (sent with their task name: the task's own rules) and the demo's word problems,
sent as *open requests* (no task grammar; extraction ``marker``, rules ``arithmetic`` + a numeric
answer); all graded here only. Printed per task, all measured in this run:

- split accuracy (5 drafts -> verify -> refine from candidates) vs the edge's first draft
  alone vs the target alone (greedy, plain vLLM on the same engine) vs the target's best-of-5
  (5 samples, majority vote on the extracted answer);
- the cloud's decode tokens per answer of each (goals: split <= 0.25x of target best-of-5 and
  <= 1.5x of its greedy answer);
- how the split answers were built: a verified draft accepted as is, a verified prefix continued,
  a refinement of candidates (together: "from drafts", goal >= 50%), or the cloud alone;
- the likelihood verifier: mean per-token logprob under the target of correct vs wrong drafts,
  and the accuracy of thresholds around the configured one (how the default was chosen);
- with ``--dtype-check``, instead: the target alone, greedy, one problem at a time, in float32 and in
  bfloat16 on the same held-out problems: accuracy per task, ms per answer, and which of the two
  ``EngineConfig.dtype`` "auto" runs on this machine (``coinfer.cloud.vllm_common.engine_dtype``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass

import grpc

log = logging.getLogger(__name__)
WORDS = "words"  # demo.wordprob.TASK, spelled here so that --help needs no torch import
KINDS = ("arith", "select", WORDS)
RULES = [{"kind": "arithmetic"}, {"kind": "numeric_bounds", "params": {"field": "answer", "min": -1e6, "max": 1e6}}]


def _rules():
    from coinfer.rules import Rule

    return [Rule(r["kind"], r.get("params", {})) for r in RULES]


@dataclass(frozen=True)
class Case:
    """One held-out problem as the benchmark sends and grades it."""

    kind: str  # "arith", "select" or "words"
    prompt: str
    item: object  # coinfer.demo.train.Item: the truth and the grader

    @property
    def task(self) -> str:
        return "" if self.kind == WORDS else self.kind  # word problems are open requests

    def rules(self) -> list:
        return _rules() if self.kind == WORDS else []

    def extraction(self):
        from coinfer.extract import Extraction

        return Extraction("marker") if self.kind == WORDS else Extraction()

    def grade(self, text: str) -> bool:
        from coinfer.demo.train import grade

        return grade(self.item, text)

    def vote_key(self, text: str) -> object:
        """What best-of-n votes on: the extracted answer (None: nothing extractable)."""
        from coinfer.extract import Extraction, answer_key
        from coinfer.tasks import TASKS

        parsed = Extraction("marker")(text) if self.kind == WORDS else TASKS[self.kind].parse_answer(text)
        return answer_key(parsed) if parsed.ok else None


def cases(kinds: tuple[str, ...], per_kind: int, seed: int, held_out: bool = True) -> list[Case]:
    from coinfer.demo.train import sample_item

    rng = random.Random(seed)
    out = []
    for kind in kinds:
        for _ in range(per_kind):
            it = sample_item(rng, kind, held_out=held_out)
            out.append(Case(kind, it.question, it))
    return out


async def _target_alone(engine, prompt: str, case: Case, n: int, key: str) -> dict:
    """Greedy and best-of-n of the target on the plain conversation (no drafts)."""
    from coinfer.cloud.engine import GenParams

    t0 = time.perf_counter()
    text, toks = "", 0
    async for c in engine.generate(prompt, GenParams(max_tokens=256), f"{key}-g"):
        text += c.text
        toks += c.tokens
    greedy_ms = (time.perf_counter() - t0) * 1e3
    samples = await engine.sample(prompt, GenParams(max_tokens=256, temperature=0.7, seed=7), n, f"{key}-s")
    votes = Counter(k for s in samples if (k := case.vote_key(s.text)) is not None)
    winner = votes.most_common(1)[0][0] if votes else None
    best = next((s.text for s in samples if winner is not None and case.vote_key(s.text) == winner), "")
    return {
        "greedy_ok": case.grade(text),
        "greedy_tokens": toks,
        "greedy_ms": greedy_ms,
        "bo5_ok": bool(best) and case.grade(best),
        "bo5_tokens": sum(s.tokens for s in samples),
        "bo5_steps": max((s.tokens for s in samples), default=0),
    }


def _threshold_table(rows: list[dict], configured: float) -> list[dict]:
    """For candidate thresholds: share of correct drafts kept, of wrong drafts rejected."""
    drafts = [d for r in rows for d in r["drafts"] if d["rules_ok"]]
    good = [d["mean_lp"] for d in drafts if d["correct"]]
    bad = [d["mean_lp"] for d in drafts if not d["correct"]]
    out = []
    for thr in sorted({-3.0, -2.0, -1.5, -1.0, -0.75, -0.5, -0.3, -0.2, -0.1, configured}):
        kept = sum(v >= thr for v in good) / max(1, len(good))
        rejected = sum(v < thr for v in bad) / max(1, len(bad))
        out.append(
            {
                "threshold": thr,
                "correct_kept": round(kept, 3),
                "wrong_rejected": round(rejected, 3),
                "balanced": round((kept + rejected) / 2, 3),
            }
        )
    return out


async def _one(pipe, engine, case: Case, i: int, drafts: int, seed: int) -> dict:
    """One problem: split through the real edge -> cloud path, then the target alone."""
    from coinfer.chat import ChatMessage
    from coinfer.edge.pipeline import Plan
    from coinfer.edge.sampling import Sampling
    from coinfer.types import FROM_DRAFTS

    t0 = time.perf_counter()
    res = await pipe.solve(
        case.task,
        case.prompt,
        case.rules(),
        Sampling(n=drafts, seed=seed + i, presence_penalty=0.0, frequency_penalty=0.0),
        Plan.SPLIT,
        120.0,
        f"b{i}",
        extraction=case.extraction(),
    )
    split_ms = (time.perf_counter() - t0) * 1e3
    alone = await _target_alone(engine, engine.render([ChatMessage("user", case.prompt)]), case, drafts, f"b{i}")
    scores = {s.draft_index: s for s in (res.summary.scores if res.summary else [])}
    d_rows = []
    for d in res.drafts:
        v = res.verdicts.get(d.index)
        sc = scores.get(d.index)
        score = (v.score if v else 0.0) or (sc.score if sc else 0.0)
        d_rows.append(
            {
                "index": d.index,
                "correct": case.grade(d.text),
                "rules_ok": bool(v and (v.valid or v.failed_rule == "likelihood")),
                "mean_lp": math.log(score) if score > 0 else -math.inf,
                "valid": bool(v and v.valid),
            }
        )
    tm = res.summary.timings if res.summary else None
    return {
        "i": i,
        "kind": case.kind,
        "split_ok": case.grade(res.answer),
        "source": res.source,
        "answer": res.answer,
        "trace": res.summary.trace if res.summary else "",
        "prompt": case.prompt,
        "refine_mode": res.refine_mode,
        "from_drafts": res.refine_mode in FROM_DRAFTS,
        "rounds": res.rounds,
        "split_ms": split_ms,
        "split_decode_steps": tm.decode_steps if tm else 0,
        "split_decode_tokens": tm.decode_tokens if tm else 0,
        "first_draft_ok": bool(d_rows and d_rows[0]["correct"]),
        "any_draft_ok": any(d["correct"] for d in d_rows if d["index"] < drafts),
        "drafts": d_rows,
        **alone,
    }


def summarize(rows: list[dict]) -> dict:
    """Accuracy, cloud tokens, answer sources and latency of a set of rows, with the goals' ratios."""
    n = max(1, len(rows))

    def acc(k: str) -> float:
        return round(sum(r[k] for r in rows) / n, 3)

    def mean(k: str) -> float:
        return round(statistics.mean(r[k] for r in rows), 1) if rows else 0.0

    out = {
        "problems": len(rows),
        "accuracy": {
            "split": acc("split_ok"),
            "edge_first_draft": acc("first_draft_ok"),
            "target_greedy": acc("greedy_ok"),
            "target_best_of_5": acc("bo5_ok"),
            "any_first_round_draft": acc("any_draft_ok"),
        },
        # every target token generated per answer (a batched request counts all its samples)
        "cloud_decode_tokens_per_answer": {
            "split": mean("split_decode_tokens"),
            "target_greedy": mean("greedy_tokens"),
            "target_best_of_5": mean("bo5_tokens"),
        },
        # the critical path: tokens decoded one after another (best-of-5 is one batched request)
        "cloud_decode_steps_per_answer": {
            "split": mean("split_decode_steps"),
            "target_greedy": mean("greedy_tokens"),
            "target_best_of_5": mean("bo5_steps"),
        },
        "from_drafts": acc("from_drafts"),
        "sources": dict(Counter(str(r["source"]) for r in rows)),
        "refine_modes": dict(Counter(r["refine_mode"] for r in rows)),
        # where split loses to the target alone: accuracy of each way an answer was built
        "accuracy_by_mode": {
            m: round(
                sum(r["split_ok"] for r in rows if r["refine_mode"] == m) / sum(r["refine_mode"] == m for r in rows), 3
            )
            for m in sorted({r["refine_mode"] for r in rows})
        },
        "median_ms": {
            "split": round(statistics.median(r["split_ms"] for r in rows)) if rows else 0,
            "target_greedy": round(statistics.median(r["greedy_ms"] for r in rows)) if rows else 0,
        },
    }
    a, tk = out["accuracy"], out["cloud_decode_tokens_per_answer"]
    out["gaps_points"] = {
        "split_minus_target_greedy": round(100 * (a["split"] - a["target_greedy"]), 1),
        "split_minus_edge_first_draft": round(100 * (a["split"] - a["edge_first_draft"]), 1),
    }
    out["split_tokens_over"] = {
        "target_best_of_5": round(tk["split"] / max(tk["target_best_of_5"], 1e-9), 3),
        "target_greedy": round(tk["split"] / max(tk["target_greedy"], 1e-9), 3),
    }
    out["goals"] = {
        "split >= target greedy + 5 pts": out["gaps_points"]["split_minus_target_greedy"] >= 5,
        "split >= edge first draft + 20 pts": out["gaps_points"]["split_minus_edge_first_draft"] >= 20,
        "split tokens <= 0.25x best-of-5": out["split_tokens_over"]["target_best_of_5"] <= 0.25,
        "split tokens <= 1.5x greedy": out["split_tokens_over"]["target_greedy"] <= 1.5,
        ">= 50% of answers from drafts": out["from_drafts"] >= 0.5,
    }
    return out


def _verifier(rows: list[dict], floor: float) -> dict:
    good = [d["mean_lp"] for r in rows for d in r["drafts"] if d["rules_ok"] and d["correct"]]
    bad = [d["mean_lp"] for r in rows for d in r["drafts"] if d["rules_ok"] and not d["correct"]]
    return {
        "configured_min_mean_logprob": floor,
        "median_mean_logprob_correct": round(statistics.median(good), 3) if good else None,
        "median_mean_logprob_wrong": round(statistics.median(bad), 3) if bad else None,
        "drafts_correct": len(good),
        "drafts_wrong": len(bad),
        "thresholds": _threshold_table(rows, floor),
    }


def add_engine_argument(ap) -> None:
    """``--engine FIELD=VALUE`` (repeatable) on ``ap``: cloud ``EngineConfig`` fields (``policy_overrides``)."""
    ap.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="set a cloud EngineConfig field (repeatable), e.g. --engine draft_speculative_tokens=8",
    )


def engine_overrides(pairs: list[str]) -> dict:
    """``--engine FIELD=VALUE`` pairs (``add_engine_argument``) as cloud ``EngineConfig`` fields."""
    from coinfer.cloud.config import EngineConfig

    return policy_overrides(pairs, EngineConfig)


def policy_overrides(pairs: list[str], config: type | None = None) -> dict:
    """``--policy name=value`` pairs as fields of ``config`` (default ``PolicyConfig``), each value parsed as its
    field's type."""
    import dataclasses

    from coinfer.cloud.config import PolicyConfig

    config = config or PolicyConfig
    flag = "--policy" if config is PolicyConfig else "--engine"
    defaults = config(model="-") if "model" in {f.name for f in dataclasses.fields(config)} else config()
    types = {f.name: type(getattr(defaults, f.name)) for f in dataclasses.fields(config)}
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in types:
            raise ValueError(f"{flag}: unknown field {name!r} (known: {', '.join(sorted(types))})")
        kind = types[name]
        out[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return out


async def run(
    n_problems: int,
    drafts: int,
    seed: int,
    concurrency: int,
    kinds: tuple[str, ...] = KINDS,
    policy: dict | None = None,
    held_out: bool = True,
) -> dict:
    from coinfer.cloud.config import CloudConfig, EngineConfig, Limits
    from coinfer.cloud.server import create_server
    from coinfer.cloud.vllm_engine import VllmEngine
    from coinfer.demo.artifacts import ensure_artifacts
    from coinfer.edge.draft_engine import OrtDraftEngine
    from coinfer.edge.pipeline import EdgePipeline

    art = ensure_artifacts()
    import dataclasses

    cfg = CloudConfig(engine=EngineConfig(model=str(art.target)), limits=Limits(max_sessions=64))
    cfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, **(policy or {})))
    srv = await create_server(cfg)
    engine = await VllmEngine(cfg.engine).start()
    await srv.attach_engine(engine)
    edge = OrtDraftEngine(art.draft_int8)
    edge.warm_up()
    probs = cases(kinds, n_problems, seed, held_out)
    sem = asyncio.Semaphore(concurrency)
    t_start = time.perf_counter()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        pipe = EdgePipeline(edge, channel)

        async def one(i: int, case: Case) -> dict:
            async with sem:
                return await _one(pipe, engine, case, i, drafts, seed)

        rows = await asyncio.gather(*(one(i, c) for i, c in enumerate(probs)))
    report = {
        "problems_per_task": n_problems,
        "side": "held-out" if held_out else "train",
        "policy": policy or {},
        "drafts": drafts,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "dtype": cfg.engine.dtype,
        "tasks": {k: summarize([r for r in rows if r["kind"] == k]) for k in kinds},
        "verifier": _verifier([r for r in rows if r["kind"] == WORDS], cfg.policy.min_mean_logprob),
        "rows": rows,
    }
    await srv.stop(grace=1.0)
    await engine.close()
    return report


async def dtype_check(probs: list[Case]) -> dict:
    """The target's greedy accuracy per task and ms per answer (one at a time) on ``probs`` under float32 and
    bfloat16, and the one "auto" resolves to here."""
    from coinfer.chat import ChatMessage
    from coinfer.cloud.config import EngineConfig
    from coinfer.cloud.engine import GenParams
    from coinfer.cloud.vllm_common import engine_dtype
    from coinfer.cloud.vllm_engine import VllmEngine
    from coinfer.demo.artifacts import ensure_artifacts

    model = str(ensure_artifacts().target)
    out: dict = {"auto_here": engine_dtype("auto"), "problems": len(probs)}
    for dtype in ("float32", "bfloat16"):
        eng = await VllmEngine(EngineConfig(model=model, dtype=dtype)).start()
        ok, times = Counter(), []
        for i, p in enumerate(probs):
            t0 = time.perf_counter()
            text = "".join(
                [
                    c.text
                    async for c in eng.generate(
                        eng.render([ChatMessage("user", p.prompt)]), GenParams(max_tokens=256), f"dt{dtype}{i}"
                    )
                ]
            )
            times.append((time.perf_counter() - t0) * 1e3)
            ok[p.kind] += p.grade(text)
        await eng.close()
        kinds = Counter(p.kind for p in probs)
        out[dtype] = {
            "accuracy": {k: round(ok[k] / n, 3) for k, n in kinds.items()},
            "p50_ms": round(statistics.median(times), 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=100, help="held-out problems per task")
    ap.add_argument("--tasks", default=",".join(KINDS), help="comma-separated, among " + ", ".join(KINDS))
    ap.add_argument("--drafts", type=int, default=5, help="drafts per problem")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--concurrency", type=int, default=4, help="problems in flight")
    ap.add_argument(
        "--dtype-check",
        action="store_true",
        help="only the target alone in float32 and in bfloat16 (accuracy, ms per answer)",
    )
    ap.add_argument("--json", help="write the report here")
    ap.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a cloud PolicyConfig field (repeatable), e.g. --policy cloud_temperature=0.3",
    )
    ap.add_argument(
        "--train-side",
        action="store_true",
        help="draw problems from the train side of the split (to tune --policy; report held-out)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    kinds = tuple(k.strip() for k in args.tasks.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error(f"--tasks: unknown {', '.join(unknown)} (known: {', '.join(KINDS)})")
    try:
        policy = policy_overrides(args.policy)
    except ValueError as exc:
        ap.error(str(exc))
    if args.dtype_check:
        print(json.dumps(asyncio.run(dtype_check(cases(kinds, args.problems, args.seed))), indent=2))
        return 0
    report = asyncio.run(
        run(
            args.problems,
            args.drafts,
            args.seed,
            args.concurrency,
            kinds,
            policy,
            not args.train_side,
        )
    )
    rows = report.pop("rows")
    print(json.dumps(report, indent=2))
    if args.json:  # the file also keeps every problem's answer and trace
        with open(args.json, "w") as f:
            json.dump({**report, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
