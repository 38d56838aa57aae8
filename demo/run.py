"""The embedded demo: cloud service and edge on this machine, CPU, the demo models.

Usage::

    python -m demo.run                      # 4 held-out problems of each task
    python -m demo.run --per-task 8 --json  # more problems, machine-readable report

Starts the cloud gRPC service (vLLM with the target model) on 127.0.0.1 with a
free port, loads the edge's INT8 draft (the quantize CLI's artefact) on ONNX Runtime,
and solves held-out problems end to end over gRPC: edge drafts -> cloud verifies each
as it arrives -> cloud refines from the best drafts -> answer streamed back. Three
kinds: the built-in presets ``arith`` and ``select``, and English word problems sent as
open requests (no task grammar: extraction ``marker``, the ``arithmetic`` rule; graded
only here). Prints, per problem, the drafts, each draft's verdict, the final answer,
whether it is correct, and the stage timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import time

import grpc

from coinfer import types as t
from coinfer.tasks import TASKS, problems
from demo.artifacts import ensure_artifacts

log = logging.getLogger(__name__)
KINDS = (*TASKS, "words")
"""The built-in presets, then the open word problems (``demo.wordprob.TASK``)."""


def _printer(quiet: bool):
    def on_event(ev) -> None:
        if quiet:
            return
        if isinstance(ev, t.Draft):
            print(f"    draft #{ev.index} ({ev.num_tokens} tok, {ev.edge_ms:.0f} ms): {ev.text}")
        elif isinstance(ev, t.Verdict):
            dup = f" (duplicate of #{ev.duplicate_of - 1})" if ev.duplicate_of else ""
            status = f"VALID score={ev.score:.3f}" if ev.valid else f"INVALID {ev.failed_rule}: {ev.error}"
            print(f"    verdict #{ev.draft_index}: {status}{dup} [{ev.verify_ms:.0f} ms]")
        elif isinstance(ev, t.RetryAdvice):
            print(f"    retry advice #{ev.attempt}: {ev.num_drafts} drafts at T={ev.sampling.temperature:.2f} ({ev.reason})")

    return on_event


async def run_demo(per_task: int, seed: int, quiet: bool, n_drafts: int, temperature: float = 0.3,
                   presence: float = 0.0, frequency: float = 0.0) -> dict:
    from cloud.config import CloudConfig, EngineConfig
    from cloud.engine import VllmEngine
    from cloud.server import create_server
    from coinfer.extract import Extraction
    from coinfer.rules import Rule
    from demo import wordprob
    from edge.draft_engine import OrtDraftEngine
    from edge.pipeline import EdgePipeline
    from edge.sampling import Sampling

    art = ensure_artifacts()
    t0 = time.perf_counter()
    cfg = CloudConfig(engine=EngineConfig(model=str(art.target)))
    srv = await create_server(cfg)
    await srv.attach_engine(await VllmEngine(cfg.engine).start())
    cloud_start = time.perf_counter() - t0
    t1 = time.perf_counter()
    engine = OrtDraftEngine(art.draft_int8)
    edge_load_ms = (time.perf_counter() - t1) * 1e3
    warm_ms = engine.warm_up()
    print(f"cloud up on 127.0.0.1:{srv.port} in {cloud_start:.1f} s; edge model loaded in {edge_load_ms:.0f} ms "
          f"(+{warm_ms:.0f} ms warm-up) on {engine.providers[0]}")
    rows = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        pipe = EdgePipeline(engine, channel)
        rng = random.Random(seed)
        for task_name in KINDS:
            if task_name == wordprob.TASK:
                stream = wordprob.problems(rng, held_out=True)
            else:
                stream = problems(rng, (task_name,), held_out=True)
            for k in range(per_task):
                p = next(stream)
                print(f"\n[{task_name} {k + 1}/{per_task}] {p.prompt}")
                sampling = Sampling(n=n_drafts, seed=seed + k, temperature=temperature, presence_penalty=presence,
                                    frequency_penalty=frequency)
                if task_name == wordprob.TASK:  # an open request: no task grammar
                    res = await pipe.solve("", p.prompt, [Rule("arithmetic")], sampling, on_event=_printer(quiet),
                                           extraction=Extraction("marker"))

                    def grade(text: str, p=p) -> bool:
                        return wordprob.grade(text, p.answer)
                else:
                    res = await pipe.solve(task_name, p.prompt, sampling=sampling, on_event=_printer(quiet))
                    task = TASKS[task_name]

                    def grade(text: str, p=p, task=task) -> bool:
                        return task.grade(p.spec, task.parse_answer(text))
                correct = grade(res.answer)
                # first-round drafts only: retry rounds sample hotter on purpose
                drafts_correct = [grade(d.text) for d in res.drafts if d.index < n_drafts]
                tm = res.summary.timings if res.summary else t.Timings()
                row = {
                    "task": task_name, "prompt": p.prompt, "answer": res.answer, "source": res.source,
                    "correct": correct, "drafts": len(drafts_correct), "drafts_correct": sum(drafts_correct),
                    "rounds": res.rounds, "first_draft_ms": res.timings.get("first_draft", 0.0),
                    "drafting_ms": res.timings.get("drafting", 0.0), "verify_ms": tm.verify_ms,
                    "refine_ttft_ms": tm.refine_ttft_ms, "refine_ms": tm.refine_ms,
                    "cloud_total_ms": tm.total_ms, "total_ms": res.timings.get("total", 0.0),
                }
                rows.append(row)
                print(f"  => answer: {res.answer!r} fields={res.fields}\n     source={res.source} "
                      f"refine={res.refine_mode or '-'} correct={'YES' if correct else 'no'} "
                      f"(first-round drafts correct {row['drafts_correct']}/{row['drafts']}, {res.rounds} round(s))")
                print(f"     timings ms: first draft {row['first_draft_ms']:.0f}, drafting {row['drafting_ms']:.0f}, "
                      f"verify (cloud, from open) {row['verify_ms']:.0f}, refine TTFT {row['refine_ttft_ms']:.0f}, "
                      f"refine {row['refine_ms']:.0f}, total {row['total_ms']:.0f}")
    await srv.stop(grace=1.0)
    report = {"problems": rows, "cloud_start_s": round(cloud_start, 1), "edge_load_ms": round(edge_load_ms, 1)}
    for task_name in KINDS:
        mine = [r for r in rows if r["task"] == task_name]
        if mine:
            report[task_name] = {
                "accuracy": sum(r["correct"] for r in mine) / len(mine),
                "draft_accuracy": sum(r["drafts_correct"] for r in mine) / max(1, sum(r["drafts"] for r in mine)),
                **{f"median_{k}": statistics.median(r[k] for r in mine)
                   for k in ("first_draft_ms", "drafting_ms", "verify_ms", "refine_ttft_ms", "refine_ms", "total_ms")},
            }
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-task", type=int, default=4, help="problems per built-in task")
    ap.add_argument("--drafts", type=int, default=5, help="drafts per problem (edge batch size)")
    ap.add_argument("--seed", type=int, default=7, help="problem and sampling seed")
    ap.add_argument("--temperature", type=float, default=0.3, help="draft sampling temperature")
    # The seed's penalties (presence 0.2, frequency 0.1) target word-level vocabularies;
    # on the demo's character-level model they punish every repeated digit, ';' and
    # space and halve draft accuracy, so the demo turns them off by default.
    ap.add_argument("--presence-penalty", type=float, default=0.0, help="draft presence penalty")
    ap.add_argument("--frequency-penalty", type=float, default=0.0, help="draft frequency penalty")
    ap.add_argument("--quiet", action="store_true", help="only answers and the summary")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON at the end")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report = asyncio.run(run_demo(args.per_task, args.seed, args.quiet, args.drafts, args.temperature,
                                  args.presence_penalty, args.frequency_penalty))
    print("\nsummary:")
    for task_name in KINDS:
        s = report.get(task_name)
        if s:
            print(f"  {task_name}: final accuracy {s['accuracy']:.0%} (first-round single drafts {s['draft_accuracy']:.0%}); "
                  f"median ms: first draft {s['median_first_draft_ms']:.0f}, drafting {s['median_drafting_ms']:.0f}, "
                  f"verify {s['median_verify_ms']:.0f}, refine {s['median_refine_ms']:.0f}, total {s['median_total_ms']:.0f}")
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
