"""Does the cloud's refinement ever turn the drafts' right answer wrong? Measured on the real model.

Usage::

    .venv/bin/python -m benchmarks.real_refine              # 32 questions, ~3 min on 2 cores
    .venv/bin/python -m benchmarks.real_refine --repeat 3 --json out.json   # 96 requests, ~5 min

SmolLM2-135M-Instruct on both sides (``coinfer.demo.real.real_stack``: its INT8 export drafts on the edge,
the float model verifies and refines on vLLM). Each question has one short known answer (capitals,
counts, facts; none of them was used to choose a threshold); it is asked through the edge's gRPC
``Solve`` stream in the split plan, with the cloud's policy set to refine free text always
(``accept_free_text_margin`` None: by default a real model's likely draft is accepted as is and the
refinement this measures rarely runs).

The stream shows both sides of the refinement guard (``PolicyConfig.refine_override_nats``) in one
run: the refinement the cloud streamed, and, when the guard refused it, the ``AnswerReset`` naming
why and the drafts' answer that replaced it. "Without the guard" is the refinement wherever the reset
says it contradicted the drafts (every other check, rules and scaffolding, ran before the guard and
would have refused it all the same); "with" is the answer returned. Counted where the verified drafts
agreed (>= 2 valid drafts, the same text whitespace aside: the session's own test of agreement on free
text): how often the answer is wrong although the drafts were right, and right although they were
wrong. One run, this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path

QUESTIONS: list[tuple[str, str]] = [
    ("What is the capital of Japan?", r"tokyo"),
    ("What is the capital of Italy?", r"rome"),
    ("What is the capital of Germany?", r"berlin"),
    ("What is the capital of Spain?", r"madrid"),
    ("What is the capital of the United Kingdom?", r"london"),
    ("What is the capital of Russia?", r"moscow"),
    ("What is the capital of China?", r"beijing"),
    ("What is the capital of Egypt?", r"cairo"),
    ("What is the capital of Greece?", r"athens"),
    ("What is the capital of Canada?", r"ottawa"),
    ("How many legs does a spider have?", r"\b(8|eight)\b"),
    ("How many days are in a week?", r"\b(7|seven)\b"),
    ("How many months are in a year?", r"\b(12|twelve)\b"),
    ("How many hours are in a day?", r"\b(24|twenty-four)\b"),
    ("What is 2 + 2?", r"\b(4|four)\b"),
    ("What is 10 times 3?", r"\b(30|thirty)\b"),
    ("What color is the sky on a clear day?", r"\bblue\b"),
    ("What color is a ripe banana?", r"\byellow\b"),
    ("What planet do we live on?", r"\bearth\b"),
    ("What is the largest planet in our solar system?", r"\bjupiter\b"),
    ("Which planet is known as the Red Planet?", r"\bmars\b"),
    ("What is the largest ocean on Earth?", r"\bpacific\b"),
    ("Who wrote Romeo and Juliet?", r"shakespeare"),
    ("What is the chemical formula of water?", r"h2o|h₂o"),
    ("What do bees make?", r"\bhoney\b"),
    ("At what temperature in degrees Celsius does water freeze?", r"\b(0|zero)\b"),
    ("At what temperature in degrees Celsius does water boil?", r"\b100\b"),
    ("Which animal is called the king of the jungle?", r"\blions?\b"),
    ("What is the opposite of hot?", r"\bcold\b"),
    ("What language is spoken in Brazil?", r"portuguese"),
    ("What is the frozen form of water called?", r"\bice\b"),
    ("Which gas do humans need to breathe to live?", r"\boxygen\b"),
]
SUFFIX = " Answer in one short sentence."
CONTRADICTS = "refinement rejected: contradicts"


def _norm(text: str) -> str:
    return " ".join(text.split())


def outcome(events, answer_re: str) -> dict:
    """One question's row from its ``SolveEvent`` stream: the drafts, their verdicts, what the cloud
    streamed before a reset, why it reset, the answer, and whether each side of the guard is right."""
    drafts = {ev.draft.index: ev.draft.text for ev in events if ev.WhichOneof("kind") == "draft"}
    valid = {ev.verdict.draft_index for ev in events if ev.WhichOneof("kind") == "verdict" and ev.verdict.valid}
    streamed, resets = [""], []
    for ev in events:
        kind = ev.WhichOneof("kind")
        if kind == "chunk":
            streamed[-1] += ev.chunk.text
        elif kind == "reset":
            resets.append(ev.reset.reason)
            streamed.append("")
    result = next(ev.result for ev in events if ev.WhichOneof("kind") == "result")
    right = re.compile(answer_re, re.IGNORECASE)
    texts = [drafts[i] for i in sorted(valid) if i in drafts]
    agreed = len(texts) >= 2 and len({_norm(t) for t in texts}) == 1
    right_answers = len(texts) >= 2 and all(right.search(t) for t in texts)
    refused = next((i for i, r in enumerate(resets) if r.startswith(CONTRADICTS)), None)
    without = streamed[refused] if refused is not None else result.answer
    return {
        "drafts": [drafts[i] for i in sorted(drafts)],
        "valid": sorted(valid),
        "agreed": agreed,
        "agreed_on_answer": right_answers,
        "drafts_right": bool(texts) and all(right.search(t) for t in texts),
        "source": result.source,
        "refine_mode": result.refine_mode,
        "resets": resets,
        "answer": result.answer,
        "without_guard": without,
        "right_with": bool(right.search(result.answer)),
        "right_without": bool(right.search(without)),
    }


def tally(rows: list[dict]) -> dict:
    """Where the drafts agreed: answers broken (drafts right, answer wrong) and fixed, with and without
    the guard; and where >= 2 valid drafts all gave the known answer in their own words (the guard
    cannot see that agreement: it compares free text as text), answers broken with and without it."""
    agreed = [r for r in rows if r["agreed"]]
    right = [r for r in rows if r["agreed_on_answer"]]
    return {
        "questions": len(rows),
        "refined": sum(r["refine_mode"] == "candidates" for r in rows),
        "agreed": len(agreed),
        "agreed_right": sum(r["drafts_right"] for r in agreed),
        "guard_refused": sum(r["without_guard"] != r["answer"] for r in rows),
        "broke_without_guard": sum(r["drafts_right"] and not r["right_without"] for r in agreed),
        "broke_with_guard": sum(r["drafts_right"] and not r["right_with"] for r in agreed),
        "fixed_without_guard": sum(not r["drafts_right"] and r["right_without"] for r in agreed),
        "fixed_with_guard": sum(not r["drafts_right"] and r["right_with"] for r in agreed),
        "drafts_all_right": len(right),
        "broke_all_right_without_guard": sum(not r["right_without"] for r in right),
        "broke_all_right_with_guard": sum(not r["right_with"] for r in right),
    }


async def run(n: int, repeat: int) -> dict:
    import grpc

    from coinfer.cloud.config import PolicyConfig
    from coinfer.demo.real import real_stack
    from coinfer.v1 import coinfer_pb2 as pb
    from coinfer.v1 import edge_pb2 as epb
    from coinfer.v1 import edge_pb2_grpc as epb_grpc

    rows = []
    async with real_stack(PolicyConfig(accept_free_text_margin=None)) as (_, daemon):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as ch:
            stub = epb_grpc.CoinferEdgeStub(ch)
            for i, (question, answer_re) in enumerate(QUESTIONS[:n] * repeat):
                req = epb.SolveRequest(
                    request_id=f"refine-{i}",
                    plan="split",
                    problem=pb.Problem(messages=[pb.ChatMessage(role="user", content=question + SUFFIX)]),
                )  # the daemon's sampling
                t0 = time.perf_counter()
                events = [ev async for ev in stub.Solve(req, timeout=120)]
                row = {
                    "question": question,
                    "ms": round((time.perf_counter() - t0) * 1e3),
                    **outcome(events, answer_re),
                }
                rows.append(row)
                mark = "agreed" if row["agreed"] else "      "
                print(
                    f"{mark} drafts {'right' if row['drafts_right'] else 'wrong'}  {row['source']:8} "
                    f"{row['ms']:5} ms  {question[:44]!r:46} -> {_norm(row['answer'])[:60]!r}"
                    + (
                        f"  [guard kept the drafts over {_norm(row['without_guard'])[:50]!r}]"
                        if row["without_guard"] != row["answer"]
                        else ""
                    ),
                    flush=True,
                )
    return {"tally": tally(rows), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=len(QUESTIONS))
    ap.add_argument("--repeat", type=int, default=1, help="ask each question this many times (fresh drafts each)")
    ap.add_argument("--json", type=Path, help="write every row and the tally here")
    args = ap.parse_args(argv)
    report = asyncio.run(run(args.questions, args.repeat))
    print(json.dumps(report["tally"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
