"""Exact split on the real model: is split's greedy answer the cloud plan's, word for word, and what did it cost?

    .venv/bin/python -m benchmarks.exact_split [--prompts 64] [--max-tokens 96] [--json]
    .venv/bin/python -m benchmarks.exact_split --remote --against IN_PROCESS.json --json   # the remote engine

SmolLM2-135M-Instruct on both sides (``coinfer.demo.real.real_stack``: the float model on the cloud's vLLM in
``CLOUD_DTYPE``, its INT8 export drafting on the edge), each of ``--prompts`` open prompts
(``benchmarks.open_prompts``) asked through the edge's OpenAI API with the official SDK, greedy, one request at a
time, under the cloud plan and under split, plain and streamed, each request on a cold cache (the in-process
engine's prefix cache and the rows its checks kept reset before it: the same prompt asked before -- the cloud plan's
answer is split's text -- would have left split's checks reading positions the cache served). Printed: how many of
split's answers equal the cloud plan's (plain and streamed), each mismatch with the target's lead of its argmax
where the two first differ (a near-tie that prefill and decode arithmetic break differently explains it), and per
answer, from the cloud's own counts (``cloud_cost``): sequential engine steps, tokens decoded, positions scored by
prefill, draft tokens offered and taken, engine requests; latency p50 (plain) and time to first content p50
(streamed) per plan, and the edge's first draft; those counts priced on an A100 with an 8B target
(``benchmarks.gpu_estimate``: an estimate). The cloud plan is plain greedy decoding on the same engine (no drafts):
its counts are greedy's. One run, one machine: ratios side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.capacity_runs import load
from benchmarks.gpu_estimate import GPUS, MODELS, estimate
from benchmarks.open_accuracy import add_engine_argument, engine_overrides, policy_overrides
from benchmarks.open_prompts import OPEN_PROMPTS

PLANS = ("cloud", "split")
COSTS = (
    "steps",
    "decoded_tokens",
    "scored_tokens",
    "prompt_tokens",
    "cached_tokens",
    "draft_tokens_offered",
    "draft_tokens_accepted",
    "engine_requests",
)


async def _ask(
    client, prompt: str, plan: str, max_tokens: int, stream: bool, temperature: float = 0.0, seed: int | None = None
) -> dict:
    kw = dict(
        model="coinfer-edge",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=temperature,
        extra_body={"coinfer": {"plan": plan}},
    )
    if temperature:  # sampled over the whole vocabulary (top_p 1: what split can take draft tokens into)
        kw |= {"top_p": 1.0, "seed": seed}
    t0 = time.perf_counter()
    if not stream:
        r = await client.chat.completions.create(**kw)
        info = r.model_extra["coinfer"]
        return {"text": r.choices[0].message.content, "ms": (time.perf_counter() - t0) * 1e3, "info": info}
    parts, first, info = [], None, {}
    async for chunk in await client.chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else (time.perf_counter() - t0) * 1e3
            parts.append(chunk.choices[0].delta.content)
        info = (chunk.model_extra or {}).get("coinfer") or info  # the last chunk's: the answer's account
    return {"text": "".join(parts), "ms": (time.perf_counter() - t0) * 1e3, "first_ms": first, "info": info}


def _how(info: dict) -> dict:
    return {
        k: info.get(k)
        for k in ("source", "refine_mode", "plan", "fallback_reason", "finish_reason", "replays")
        if k in info
    }


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


async def _lead(engine, prompt: str, a: str, b: str) -> float:
    """The target's lead of its argmax over the runner-up where ``a`` and ``b`` first differ."""
    from coinfer.chat import ChatMessage

    common = _first_difference(a, b)
    ids = await engine.prompt_ids(engine.render([ChatMessage("user", prompt)]))
    head = await engine.text_ids(a[:common])
    _, leads = await engine.top_tokens(ids + head, len(ids + head), f"lead-{time.monotonic_ns()}")
    return leads[-1]


def _where_they_differ(a: str, b: str, context: int = 40) -> dict:
    """Where the cloud plan's text ``a`` and split's ``b`` first differ, with ``context`` characters around it."""
    common = _first_difference(a, b)
    lo = max(0, common - context)
    return {
        "at_char": common,
        "lengths": [len(a), len(b)],
        "cloud": a[lo : common + context],
        "split": b[lo : common + context],
    }


def _mean(rows: list[dict], plan: str, key: str) -> float:
    return statistics.fmean(r[plan]["info"]["cloud_cost"][key] for r in rows)


@contextlib.asynccontextmanager
async def _stack(policy, remote: bool, engine_fields: dict | None = None):
    """``real_stack``; ``remote``: the cloud in front of vLLM's own OpenAI server on the same model and dtype
    (``coinfer.cloud.remote_engine``), started here and stopped after."""
    from coinfer.demo.real import real_stack

    if not remote:
        async with real_stack(policy, engine_fields=engine_fields) as stack:
            yield stack
        return
    from benchmarks.replica import vllm_server
    from coinfer.quantize.real_model import CLOUD_DTYPE, imported_dir

    with tempfile.TemporaryDirectory(prefix="exact-split-") as logs:
        async with vllm_server(imported_dir(), Path(logs), 2048, CLOUD_DTYPE) as (srv, _, _):
            async with real_stack(policy, engine_url=srv.url) as stack:
                yield stack


async def run(
    prompts: int,
    max_tokens: int,
    policy_fields: dict | None = None,
    skip: int = 0,
    temperature: float = 0.0,
    remote: bool = False,
    engine_fields: dict | None = None,
) -> dict:
    from openai import AsyncOpenAI

    from coinfer.cloud.config import PolicyConfig

    rows = []
    policy = PolicyConfig(**policy_fields) if policy_fields else None
    async with _stack(policy, remote, engine_fields) as (engine, daemon):
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{daemon.http_port}/v1", api_key="unused", max_retries=0)
        await _ask(client, "Hello!", "split", 8, False)  # lazy set-up out of the measurement
        # the in-process engine starts every request cold; vLLM's own server has no reset (its checks never read
        # the cache, its decodes do: split's prompt is then cached by the cloud plan's request before it)
        cold = not remote
        for i, prompt in enumerate(OPEN_PROMPTS[skip : skip + prompts]):
            row = {"prompt": prompt}
            for plan in PLANS:
                for kind, stream in (("", False), ("_stream", True)):
                    if cold:  # first sight: no request reads what the one before it computed
                        await engine.reset_prefix_cache()
                    row[f"{plan}{kind}"] = await _ask(client, prompt, plan, max_tokens, stream, temperature, i)
            for kind in ("", "_stream"):
                a, b = row[f"cloud{kind}"]["text"], row[f"split{kind}"]["text"]
                row[f"equal{kind}"] = a == b
                if a != b and not temperature:  # sampled answers differ by design: the same law, not the same text
                    row[f"lead{kind}"] = await _lead(engine, prompt, a, b)
            rows.append(row)
            s = row["split"]["info"]["cloud_cost"]
            print(
                f"[{i + 1}/{prompts}] equal {row['equal']}/{row['equal_stream']}  split took "
                f"{s['draft_tokens_accepted']}/{s['draft_tokens_offered']} draft tokens, {s['steps']} steps "
                f"(cloud plan {row['cloud']['info']['cloud_cost']['steps']})  {prompt!r}",
                file=sys.stderr,
            )
    return report(rows, temperature) | {"engine": "remote" if remote else "in-process", "cold": cold}


def report(rows: list[dict], temperature: float = 0.0) -> dict:
    """The run's table from its rows (pure). Sampled (``temperature`` > 0): no mismatch is one, none is listed."""
    n = len(rows)
    per_answer = {plan: {k: round(_mean(rows, plan, k), 2) for k in COSTS} for plan in PLANS}
    c, s = per_answer["cloud"], per_answer["split"]
    greedy_tokens = c["decoded_tokens"]
    return {
        "prompts": n,
        "temperature": temperature,
        "equal_plain": sum(r["equal"] for r in rows),
        "equal_streamed": sum(r["equal_stream"] for r in rows),
        "mismatches": [
            {
                "prompt": r["prompt"],
                "streamed": bool(k),
                "lead_nats": round(r[f"lead{k}"], 5),
                **_where_they_differ(r[f"cloud{k}"]["text"], r[f"split{k}"]["text"]),
                # how each answered (a fallback to the edge's own answer under load is no exact split)
                "how": {plan: _how(r[f"{plan}{k}"].get("info") or {}) for plan in PLANS},
            }
            for r in rows
            for k in ("", "_stream")
            if not r[f"equal{k}"] and not temperature
        ],
        "per_answer": per_answer,
        # each plan's plain answer, so that two runs (the in-process engine and the remote one) compare text by text
        "answers": [{"prompt": r["prompt"], **{p: r[p]["text"] for p in PLANS}} for r in rows],
        "split_steps_over_greedy": round(s["steps"] / c["steps"], 3),
        "split_scored_plus_decoded_over_greedy_tokens": round(
            (s["scored_tokens"] + s["decoded_tokens"]) / greedy_tokens, 3
        ),
        "draft_tokens_taken_share": round(s["draft_tokens_accepted"] / max(1e-9, s["draft_tokens_offered"]), 3),
        "answer_tokens_from_drafts": round(s["draft_tokens_accepted"] / greedy_tokens, 3),
        "latency_p50_ms": {p: round(statistics.median(r[p]["ms"] for r in rows)) for p in PLANS},
        "first_content_p50_ms": {
            p: round(statistics.median(r[f"{p}_stream"]["first_ms"] or r[f"{p}_stream"]["ms"] for r in rows))
            for p in PLANS
        },
        "edge_first_draft_p50_ms": round(
            statistics.median(r["split"]["info"]["timings_ms"].get("first_draft", 0.0) for r in rows)
        ),
        # these counts priced on a GPU by a roofline: an estimate (benchmarks.gpu_estimate), never a measurement
        "gpu_estimate": estimate(per_answer, GPUS["a100-80gb"], MODELS["llama-3.1-8b"], [1, 16, 64]),
    }


def same_answers(ours: dict, theirs: dict) -> dict:
    """How many of each plan's plain answers equal another run's for the same prompt (pure), and the prompts of
    those that differ."""
    by_prompt = {a["prompt"]: a for a in theirs.get("answers", [])}
    shared = [(a, by_prompt[a["prompt"]]) for a in ours.get("answers", []) if a["prompt"] in by_prompt]
    return {
        "prompts": len(shared),
        **{f"equal_{p}": sum(a[p] == b[p] for a, b in shared) for p in PLANS},
        "differ": [{"prompt": a["prompt"], "plans": [p for p in PLANS if a[p] != b[p]]} for a, b in shared if a != b],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=64, help="open prompts, at most 128 (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=96, help="each answer's budget")
    ap.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a cloud PolicyConfig field (repeatable), e.g. --policy draft_from_wait_ms=30000",
    )
    add_engine_argument(ap)
    ap.add_argument("--skip", type=int, default=0, help="start at this open prompt (default 0)")
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature (top_p 1, seeded by prompt): split keeps the target's distribution, not "
        "its text, so only the counts compare (default 0: greedy)",
    )
    ap.add_argument(
        "--remote",
        action="store_true",
        help="the cloud in front of vLLM's own OpenAI server on the same model (coinfer.cloud.remote_engine)",
    )
    ap.add_argument(
        "--against",
        type=Path,
        metavar="REPORT.json",
        help="another run's --json report: count the plain answers equal to its, plan by plan",
    )
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = ap.parse_args(argv)
    fields = policy_overrides(args.policy)
    n = min(args.prompts, len(OPEN_PROMPTS) - args.skip)
    engine = engine_overrides(args.engine) if args.engine else None
    out = asyncio.run(run(n, args.max_tokens, fields, args.skip, args.temperature, args.remote, engine))
    out["engine_fields"] = engine or {}
    if args.against:
        out["same_as_against"] = same_answers(out, load([args.against])[0])
    print(json.dumps(out, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
