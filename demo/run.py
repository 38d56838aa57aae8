"""The embedded demo: cloud service and edge on this machine, CPU, the demo models.

Usage::

    python -m coinfer.demo.run                      # 60 held-out problems of each task, 2 of them shown in full
    python -m coinfer.demo.run --per-task 40 --show 0 --json  # more problems, only the summary and a JSON report

Loads the edge's INT8 draft (the quantize CLI's artefact) on ONNX Runtime, starts the cloud
gRPC service (vLLM with the target model) on 127.0.0.1 with a free port, and solves held-out
problems end to end over gRPC: edge drafts -> cloud verifies each as it arrives -> cloud
refines from the best drafts -> answer streamed back. Three kinds: the built-in presets
``arith`` and ``select``, and English word problems sent as open requests (no task grammar:
extraction ``marker``, the ``arithmetic`` rule; graded only here). Prints, per problem, the
drafts, each draft's verdict, the final answer, whether it is correct, and the stage timings;
then the same problem answered by the target alone (greedy, no drafts, on the same vLLM engine).
The first ``--show`` problems of each kind are printed in full; the rest as one line each (enough
problems that the table below compares more than luck: at 4 per kind, 1 problem is 25 points).

Ends with a table per kind, all from this run: the final (split) accuracy vs the edge's first
draft alone vs the target alone, and the target tokens the cloud decoded per answer for each.
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
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

import grpc

from coinfer import types as t
from coinfer.demo import wordprob
from coinfer.demo.artifacts import ensure_artifacts
from coinfer.edge.sampling import DEFAULT_DRAFTS
from coinfer.tasks import TASKS, problems

if TYPE_CHECKING:  # the engines import ONNX Runtime, vLLM and torch: only when the demo runs, not for --help
    from coinfer.cloud.server import CloudServer
    from coinfer.cloud.vllm_engine import VllmEngine
    from coinfer.edge.draft_engine import OrtDraftEngine
    from coinfer.edge.pipeline import EdgePipeline
    from coinfer.edge.result import EdgeResult
    from coinfer.edge.sampling import Sampling

log = logging.getLogger(__name__)
KINDS = (*TASKS, wordprob.TASK)
"""The built-in presets, then the open word problems (``coinfer.demo.wordprob.TASK``)."""
STAGES = ("first_draft_ms", "drafting_ms", "verify_ms", "refine_ttft_ms", "refine_ms", "total_ms")
"""The split's stage timings of each problem (ms), summarised as medians per kind."""


@dataclass(frozen=True)
class Case:
    """One held-out problem as the demo sends it and grades it (the grade is the demo's only)."""

    kind: str
    """A built-in preset, or ``wordprob.TASK`` (sent as an open request)."""
    index: int
    """Position among its kind's problems: the drafts' seed offset."""
    prompt: str
    grade: Callable[[str], bool]
    """Whether an answer text is correct."""

    @property
    def is_open(self) -> bool:
        return self.kind == wordprob.TASK


@dataclass(frozen=True)
class Drafting:
    """How the edge samples its drafts."""

    n: int
    seed: int
    temperature: float = 0.3
    presence: float = 0.0
    frequency: float = 0.0

    def sampling(self, case: Case) -> Sampling:
        from coinfer.edge.sampling import Sampling

        return Sampling(
            n=self.n,
            seed=self.seed + case.index,
            temperature=self.temperature,
            presence_penalty=self.presence,
            frequency_penalty=self.frequency,
        )


def cases(rng: random.Random, per_task: int) -> list[Case]:
    """``per_task`` held-out problems of each kind, drawn in ``KINDS`` order from one ``rng``."""
    out: list[Case] = []
    for kind in KINDS:
        if kind == wordprob.TASK:
            for k, p in enumerate(islice(wordprob.problems(rng, held_out=True), per_task)):
                out.append(Case(kind, k, p.prompt, lambda text, answer=p.answer: wordprob.grade(text, answer)))
        else:
            task = TASKS[kind]
            for k, p in enumerate(islice(problems(rng, (kind,), held_out=True), per_task)):
                out.append(
                    Case(
                        kind,
                        k,
                        p.prompt,
                        lambda text, spec=p.spec, task=task: task.grade(spec, task.parse_answer(text)),
                    )
                )
    return out


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
            print(
                f"    retry advice #{ev.attempt}: {ev.num_drafts} drafts at T={ev.sampling.temperature:.2f} ({ev.reason})"
            )

    return on_event


async def _split(pipe: EdgePipeline, case: Case, drafting: Drafting, quiet: bool) -> EdgeResult:
    """The co-inference answer: the edge's drafts, verified and refined by the cloud."""
    from coinfer.extract import Extraction
    from coinfer.rules import Rule

    sampling = drafting.sampling(case)
    if case.is_open:  # an open request: no task grammar
        return await pipe.solve(
            "", case.prompt, [Rule("arithmetic")], sampling, on_event=_printer(quiet), extraction=Extraction("marker")
        )
    return await pipe.solve(case.kind, case.prompt, sampling=sampling, on_event=_printer(quiet))


async def _target_alone(target: VllmEngine, case: Case, max_tokens: int) -> dict:
    """The cloud's model answering the same conversation by itself: greedy, no drafts, on the engine
    the service runs (the baseline co-inference has to match in accuracy and beat in cloud tokens)."""
    from coinfer.chat import ChatMessage
    from coinfer.cloud.engine import GenParams

    prompt = target.render([ChatMessage("user", case.prompt)])
    t0 = time.perf_counter()
    text, tokens = "", 0
    async for chunk in target.generate(prompt, GenParams(max_tokens=max_tokens), f"alone-{case.kind}-{case.index}"):
        text += chunk.text
        tokens += chunk.tokens
    return {
        "target_answer": text,
        "target_correct": case.grade(text),
        "target_tokens": tokens,
        "target_ms": (time.perf_counter() - t0) * 1e3,
    }


def _row(case: Case, res: EdgeResult, alone: dict, n_drafts: int) -> dict:
    """One problem's line of the report: the split's answer, its drafts graded, its timings, the target alone."""
    first_round = {d.index: case.grade(d.text) for d in res.drafts if d.index < n_drafts}  # retries sample hotter
    tm = res.summary.timings if res.summary else t.Timings()
    return {
        "task": case.kind,
        "prompt": case.prompt,
        "answer": res.answer,
        "source": res.source,
        "refine_mode": res.refine_mode,
        "correct": case.grade(res.answer),
        "drafts": len(first_round),
        "drafts_correct": sum(first_round.values()),
        "first_draft_correct": first_round.get(0, False),
        "rounds": res.rounds,
        "cloud_tokens": tm.decode_tokens,
        "first_draft_ms": res.timings.get("first_draft", 0.0),
        "drafting_ms": res.timings.get("drafting", 0.0),
        "verify_ms": tm.verify_ms,
        "refine_ttft_ms": tm.refine_ttft_ms,
        "refine_ms": tm.refine_ms,
        "cloud_total_ms": tm.total_ms,
        "total_ms": res.timings.get("total", 0.0),
        **alone,
    }


def _yes(ok: bool) -> str:
    return "YES" if ok else "no"


def _print_row(row: dict, fields: dict) -> None:
    print(
        f"  => answer: {row['answer']!r} fields={fields}\n     source={row['source']} "
        f"refine={row['refine_mode'] or '-'} correct={_yes(row['correct'])} "
        f"(first-round drafts correct {row['drafts_correct']}/{row['drafts']}, {row['rounds']} round(s)); "
        f"cloud decoded {row['cloud_tokens']} tokens"
    )
    print(
        f"     timings ms: first draft {row['first_draft_ms']:.0f}, drafting {row['drafting_ms']:.0f}, "
        f"verify (cloud, from open) {row['verify_ms']:.0f}, refine TTFT {row['refine_ttft_ms']:.0f}, "
        f"refine {row['refine_ms']:.0f}, total {row['total_ms']:.0f}"
    )
    print(
        f"     target alone: correct={_yes(row['target_correct'])}, {row['target_tokens']} tokens, "
        f"{row['target_ms']:.0f} ms"
    )


async def _start(art) -> tuple[CloudServer, VllmEngine, OrtDraftEngine, dict]:
    """(cloud server, its vLLM engine, the edge's draft engine, start-up figures)."""
    from coinfer.cloud.config import CloudConfig, EngineConfig
    from coinfer.cloud.server import create_server
    from coinfer.cloud.vllm_engine import VllmEngine
    from coinfer.edge.draft_engine import OrtDraftEngine

    t0 = time.perf_counter()
    cfg = CloudConfig(engine=EngineConfig(model=str(art.target)))
    srv = await create_server(cfg)
    target = await VllmEngine(cfg.engine).start()
    await srv.attach_engine(target)
    cloud_start = time.perf_counter() - t0
    # off the loop, as the edge daemon loads it: the cloud server on this loop is serving (its loop watch armed)
    t1 = time.perf_counter()
    edge = await asyncio.to_thread(OrtDraftEngine, art.draft_int8)
    edge_load_ms = (time.perf_counter() - t1) * 1e3
    warm_ms = await asyncio.to_thread(edge.warm_up)
    print(
        f"cloud up on 127.0.0.1:{srv.port} in {cloud_start:.1f} s; edge model loaded in {edge_load_ms:.0f} ms "
        f"(+{warm_ms:.0f} ms warm-up) on {edge.providers[0]}"
    )
    return srv, target, edge, {"cloud_start_s": round(cloud_start, 1), "edge_load_ms": round(edge_load_ms, 1)}


async def run_demo(
    per_task: int,
    seed: int,
    quiet: bool,
    n_drafts: int,
    temperature: float = 0.3,
    presence: float = 0.0,
    frequency: float = 0.0,
    show: int | None = None,
) -> dict:
    """Solve ``per_task`` problems of each kind; print the first ``show`` of each in full (all if None)."""
    from coinfer.edge.pipeline import EdgePipeline

    drafting = Drafting(n_drafts, seed, temperature, presence, frequency)
    srv, target, edge, startup = await _start(ensure_artifacts())
    max_tokens = srv.cfg.policy.refine_max_tokens  # the budget the cloud gives itself when it answers alone
    rows = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            pipe = EdgePipeline(edge, channel)
            for case in cases(random.Random(seed), per_task):
                full = show is None or case.index < show
                if full:
                    print(f"\n[{case.kind} {case.index + 1}/{per_task}] {case.prompt}")
                res = await _split(pipe, case, drafting, quiet or not full)
                # after the split: the target alone may find the prompt's prefill cached (a bias in its favour)
                rows.append(_row(case, res, await _target_alone(target, case, max_tokens), n_drafts))
                if full:
                    _print_row(rows[-1], res.fields)
                else:
                    r = rows[-1]
                    print(
                        f"[{case.kind} {case.index + 1}/{per_task}] split {_yes(r['correct'])} "
                        f"({r['refine_mode'] or r['source']}, {r['cloud_tokens']} tok), "
                        f"target alone {_yes(r['target_correct'])} ({r['target_tokens']} tok)"
                    )
    finally:
        await srv.stop(grace=1.0)
    report = {"problems": rows, **startup}
    report.update(summarize(rows))
    return report


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per kind with problems: accuracy of the split, of the edge's first draft alone (draft #0), of every
    first-round draft (``draft_accuracy``) and of the target alone; target tokens decoded per answer
    (``cloud_tokens_per_answer``); median stage timings (``median_<stage>``)."""
    out = {}
    for kind in KINDS:
        mine = [r for r in rows if r["task"] == kind]
        if not mine:
            continue
        out[kind] = {
            "problems": len(mine),
            "accuracy": _mean([r["correct"] for r in mine]),
            "first_draft_accuracy": _mean([r["first_draft_correct"] for r in mine]),
            "target_alone_accuracy": _mean([r["target_correct"] for r in mine]),
            "draft_accuracy": sum(r["drafts_correct"] for r in mine) / max(1, sum(r["drafts"] for r in mine)),
            "cloud_tokens_per_answer": {
                "split": _mean([r["cloud_tokens"] for r in mine]),
                "target_alone": _mean([r["target_tokens"] for r in mine]),
            },
            **{f"median_{k}": statistics.median(r[k] for r in mine) for k in (*STAGES, "target_ms")},
        }
    return out


COLUMNS = (
    "task",
    "n",
    "split acc",
    "first draft acc",
    "target acc",
    "split tok",
    "target tok",
    "split ms",
    "target ms",
)
LEGEND = (
    "acc: share correct of the split answer, of the edge's first draft alone, of the target alone (greedy, no drafts)",
    "tok: target tokens the cloud decoded per answer (verifying a draft is a prefill: not counted)",
    "ms: median time per answer",
)


def summary_table(report: dict) -> list[str]:
    """The report's per-kind summary as aligned text lines, the header first (``COLUMNS``, ``LEGEND``)."""
    lines = [COLUMNS]
    for kind in KINDS:
        s = report.get(kind)
        if s:
            tok = s["cloud_tokens_per_answer"]
            lines.append(
                (
                    kind,
                    str(s["problems"]),
                    f"{s['accuracy']:.0%}",
                    f"{s['first_draft_accuracy']:.0%}",
                    f"{s['target_alone_accuracy']:.0%}",
                    f"{tok['split']:.1f}",
                    f"{tok['target_alone']:.1f}",
                    f"{s['median_total_ms']:.0f}",
                    f"{s['median_target_ms']:.0f}",
                )
            )
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
        for line in lines
    ]


def print_summary(report: dict) -> None:
    print("\nsummary (all from this run):")
    for line in (*summary_table(report), *LEGEND):
        print(f"  {line}")
    for kind in KINDS:
        s = report.get(kind)
        if s:
            print(
                f"  {kind}: every first-round draft {s['draft_accuracy']:.0%} correct; split median ms: first draft "
                f"{s['median_first_draft_ms']:.0f}, drafting {s['median_drafting_ms']:.0f}, verify "
                f"{s['median_verify_ms']:.0f}, refine {s['median_refine_ms']:.0f}, total {s['median_total_ms']:.0f}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--per-task",
        type=int,
        default=60,
        help="problems per kind (20 left split tied with the target alone on two kinds: a few points "
        "are one or two problems there)",
    )
    ap.add_argument("--show", type=int, default=2, help="problems per kind printed in full (drafts, verdicts, timings)")
    ap.add_argument("--drafts", type=int, default=DEFAULT_DRAFTS, help="drafts per problem (edge batch size)")
    ap.add_argument("--seed", type=int, default=7, help="problem and sampling seed")
    ap.add_argument("--temperature", type=float, default=0.3, help="draft sampling temperature")
    # The seed's penalties (presence 0.2, frequency 0.1) target word-level vocabularies; the demo's
    # BPE splits numbers into digits, so they punish every repeated digit and ';' and halve draft
    # accuracy: the demo turns them off by default.
    ap.add_argument("--presence-penalty", type=float, default=0.0, help="draft presence penalty")
    ap.add_argument("--frequency-penalty", type=float, default=0.0, help="draft frequency penalty")
    ap.add_argument("--quiet", action="store_true", help="only answers and the summary")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON at the end")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report = asyncio.run(
        run_demo(
            args.per_task,
            args.seed,
            args.quiet,
            args.drafts,
            args.temperature,
            args.presence_penalty,
            args.frequency_penalty,
            args.show,
        )
    )
    print_summary(report)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
