"""The likelihood verifier on a real model: which thresholds keep good drafts and reject bad ones.

Usage::

    .venv/bin/python -m benchmarks.real_verifier                 # 16 prompts, ~4 min on 2 cores
    .venv/bin/python -m benchmarks.real_verifier --prompts 32 --json out.json

SmolLM2-135M-Instruct (``quantize.real_model``): its INT8 edge artefact drafts 5 answers per chat
prompt (the shipped generic prompts, the edge's default sampling, up to 128 tokens); the float model
on vLLM scores each (mean per-token logprob of the draft in the rendered conversation, as the cloud's
verifier does). Bad drafts are the same drafts corrupted (a third of their words replaced by words of
other prompts' drafts, order kept): fluent-looking text that does not answer. For each rule -- the
absolute threshold at several values, and the relative one (the target's mean logprob at least the
draft model's own minus a margin, floored) -- the share of good drafts kept and of corrupted drafts
rejected. One run, this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

ABSOLUTE = (-0.5, -1.0, -1.5, -2.0, -2.5)
MARGINS = (0.1, 0.25, 0.5, 1.0)
AS_IS_TOKEN = (-3.0, -5.0, -8.0, -12.0)


def corrupt(text: str, pool: list[str], rng: random.Random, share: float = 1 / 3) -> str:
    words = text.split(" ")
    for i in rng.sample(range(len(words)), max(1, int(len(words) * share))):
        words[i] = rng.choice(pool)
    return " ".join(words)


def rates(good: list[tuple[float, float, float]], bad: list[tuple[float, float, float]], accept) -> dict:
    """``accept(target mean, own mean, target's least likely token)`` over good and bad drafts."""
    kept = sum(accept(*g) for g in good) / max(1, len(good))
    rejected = sum(not accept(*b) for b in bad) / max(1, len(bad))
    return {"good_kept": round(kept, 3), "bad_rejected": round(rejected, 3), "balanced": round((kept + rejected) / 2, 3)}


async def run(n_prompts: int, seed: int) -> dict:
    from cloud.config import EngineConfig
    from cloud.engine import VllmEngine
    from coinfer.chat import ChatMessage
    from edge.draft_engine import OrtDraftEngine
    from edge.sampling import Sampling
    from quantize.real_model import edge_dir, imported_dir

    prompts = [json.loads(line)["prompt"] for line in
               (Path(__file__).resolve().parents[1] / "quantize/data/generic_prompts.jsonl").read_text().splitlines()]
    prompts = prompts[1::2][:n_prompts]  # the odd lines: what the INT8 gates hold out
    edge = OrtDraftEngine(edge_dir())
    engine = await VllmEngine(EngineConfig(model=str(imported_dir()), max_model_len=2048)).start()
    rng = random.Random(seed)
    try:
        drafted = []
        for i, p in enumerate(prompts):
            conv = [ChatMessage("user", p)]
            ds = await asyncio.to_thread(edge.generate, edge.render(conv), Sampling(n=5, max_new_tokens=128, seed=i))
            drafted.append((conv, [d for d in ds if d.text.strip()]))
        pool = [w for _, ds in drafted for d in ds for w in d.text.split()]
        good, bad = [], []
        for i, (conv, ds) in enumerate(drafted):
            prompt = engine.render(conv)
            for d in ds:
                for text, out in ((d.text, good), (corrupt(d.text, pool, rng), bad)):
                    lps = await engine.continuation_logprobs(prompt, text, f"v{i}-{d.index}-{len(out)}",
                                                             end=d.finish_reason != "length")
                    if lps:
                        out.append((sum(lps) / len(lps), d.mean_logprob, min(lps)))
    finally:
        await engine.close()
    report = {"prompts": len(prompts), "good": len(good), "bad": len(bad),
              "median_target_good": sorted(g[0] for g in good)[len(good) // 2],
              "median_target_bad": sorted(b[0] for b in bad)[len(bad) // 2],
              "median_own": sorted(g[1] for g in good)[len(good) // 2],
              "median_least_likely_token_good": sorted(g[2] for g in good)[len(good) // 2],
              "median_least_likely_token_bad": sorted(b[2] for b in bad)[len(bad) // 2]}
    report["absolute"] = {str(a): rates(good, bad, lambda t, o, lo, a=a: t >= a) for a in ABSOLUTE}
    report["relative"] = {str(m): rates(good, bad, lambda t, o, lo, m=m: t >= min(-0.5, o - m)) for m in MARGINS}
    # accepted as is (no refinement): the target's mean within ``m`` of the draft model's own and no
    # token below ``tok`` (PolicyConfig.accept_free_text_margin, accept_min_token_logprob)
    report["as_is"] = {f"{m}/{tok}": rates(good, bad, lambda t, o, lo, m=m, tok=tok: t >= o - m and lo >= tok)
                       for m in (0.1, 0.25, 0.5) for tok in AS_IS_TOKEN}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args(argv)
    report = asyncio.run(run(args.prompts, args.seed))
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
