"""vLLM n-gram (prompt-lookup) speculative decoding for the refinement: supported here, and faster?

Usage::

    .venv/bin/python -m benchmarks.ngram_spec [--problems 40] [--k 4]

The refinement prompt holds the candidate drafts, and the refined answer mostly copies one, so
prompt lookup should propose long runs of accepted tokens. One run: the demo target on vLLM
without and then with ``speculative_config={"method": "ngram", ...}``; the same held-out word
problems, each refined greedily from two candidate solutions (one right, one with a wrong
step); decode tokens per second of each (time after the first token), whether the answers are
identical (greedy: they must be), and whether the likelihood verifier (prompt logprobs) still
works with speculation on; then the same prompts all at once (batched, as under load) and
whether the answers still match the sequential baseline. Prints one JSON report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time


async def _measure(model: str, k: int, prompts: list[str]) -> dict:
    from coinfer.cloud.config import EngineConfig
    from coinfer.cloud.engine import GenParams
    from coinfer.cloud.vllm_engine import VllmEngine

    out: dict = {"k": k}
    try:
        eng = await VllmEngine(EngineConfig(model=model, ngram_speculative_tokens=k)).start()
    except Exception as exc:  # noqa: BLE001 - the report says why this build cannot
        return out | {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    try:
        rates, texts = [], []
        for i, prompt in enumerate(prompts):
            first, toks, text = None, 0, ""
            async for c in eng.generate(prompt, GenParams(max_tokens=128), f"ng{k}-{i}"):
                first = first or time.perf_counter()
                toks += c.tokens
                text += c.text
            if first and toks > 1:
                rates.append((toks - 1) / max(1e-6, time.perf_counter() - first))
            texts.append(text)

        # the same prompts, all at once: the engine batches them (as it does under load)
        async def one(i: int, prompt: str) -> str:
            return "".join([c.text async for c in eng.generate(prompt, GenParams(max_tokens=128), f"ngc{k}-{i}")])

        out["texts_concurrent"] = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        try:
            lps = await eng.continuation_logprobs(prompts[0], texts[0], "ng-lp")
            out["prompt_logprobs_ok"] = bool(lps)
        except Exception as exc:  # noqa: BLE001
            out["prompt_logprobs_ok"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out |= {"decode_tok_per_s_median": round(statistics.median(rates), 1), "texts": texts}
    finally:
        await eng.close()
    return out


async def run(n: int, k: int) -> dict:
    from coinfer.chat import ChatFormat, ChatMessage, refine_question
    from coinfer.demo import wordprob
    from coinfer.demo.artifacts import ensure_artifacts

    art = ensure_artifacts()
    fmt = ChatFormat.from_dir(art.target)
    rng = random.Random(3)
    stream = wordprob.problems(rng, held_out=True)
    prompts = []
    for _ in range(n):
        p = next(stream)
        q = refine_question(p.prompt, [p.solution, wordprob.corrupt(p.solution, rng)])
        prompts.append(fmt.render([ChatMessage("user", q)]))
    base = await _measure(str(art.target), 0, prompts)
    spec = await _measure(str(art.target), k, prompts)
    report = {
        "problems": n,
        "baseline": {x: v for x, v in base.items() if not x.startswith("texts")},
        "ngram": {x: v for x, v in spec.items() if not x.startswith("texts")},
    }
    if "texts" in base and "texts" in spec:
        report["identical_answers"] = sum(a == b for a, b in zip(base["texts"], spec["texts"]))
        # greedy answers must not depend on batching: with and without speculation
        report["identical_answers_concurrent"] = {
            "baseline": sum(a == b for a, b in zip(base["texts"], base["texts_concurrent"])),
            "ngram": sum(a == b for a, b in zip(base["texts"], spec["texts_concurrent"])),
        }
        report["speedup"] = round(spec["decode_tok_per_s_median"] / base["decode_tok_per_s_median"], 3)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--k", type=int, default=4, help="speculative tokens per step")
    args = ap.parse_args(argv)
    print(json.dumps(asyncio.run(run(args.problems, args.k)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
