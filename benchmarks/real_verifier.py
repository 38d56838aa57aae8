"""The likelihood verifier on a real model: which thresholds keep good drafts and reject bad ones.

Usage::

    .venv/bin/python -m benchmarks.real_verifier                 # 16 prompts, ~4 min on 2 cores
    .venv/bin/python -m benchmarks.real_verifier --prompts 32 --json out.json
    .venv/bin/python -m benchmarks.real_verifier --pair demo --prompts 60   # the demo pair, held-out task problems

SmolLM2-135M-Instruct (``coinfer.quantize.real_model``): its INT8 edge artefact drafts 5 answers per chat
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
    return {
        "good_kept": round(kept, 3),
        "bad_rejected": round(rejected, 3),
        "balanced": round((kept + rejected) / 2, 3),
    }


def _pair(pair: str, n_prompts: int):
    """(edge draft engine, target engine config, prompts, grader) of the real model or the demo pair; the
    grader says whether draft text of prompt i is right (None: it fails the rules), None when nothing grades."""
    from coinfer.cloud.config import EngineConfig
    from coinfer.edge.draft_engine import OrtDraftEngine

    if pair == "demo":
        # the demo pair's open requests: held-out word problems, sent as open_accuracy sends them
        # (extraction "marker", its rules). The threshold judges drafts that passed the rules, so
        # only those are scored: good = right, wrong = rule-passing but wrong.
        from benchmarks.open_accuracy import WORDS, cases
        from coinfer.demo.artifacts import ensure_artifacts
        from coinfer.rules import RuleSet
        from coinfer.tasks import OPEN

        art = ensure_artifacts()
        cs = cases((WORDS,), n_prompts, seed=2024)
        rulesets = [RuleSet(c.rules(), OPEN, {}, extraction=c.extraction()) for c in cs]

        def graded(i: int, text: str) -> bool | None:
            return cs[i].grade(text) if rulesets[i].check(text)[0].valid else None

        return OrtDraftEngine(art.draft_int8), EngineConfig(model=str(art.target)), [c.prompt for c in cs], graded
    from coinfer.quantize.real_model import edge_dir, imported_dir

    prompts = [
        json.loads(line)["prompt"]
        for line in (Path(__file__).resolve().parents[1] / "quantize/data/generic_prompts.jsonl")
        .read_text()
        .splitlines()
    ]
    prompts = prompts[1::2][:n_prompts]  # the odd lines: what the INT8 gates hold out
    return OrtDraftEngine(edge_dir()), EngineConfig(model=str(imported_dir()), max_model_len=2048), prompts, None


async def run(n_prompts: int, seed: int, pair: str = "real") -> dict:
    from coinfer.chat import ChatMessage
    from coinfer.cloud.config import PolicyConfig
    from coinfer.cloud.vllm_engine import VllmEngine
    from coinfer.edge.sampling import Sampling

    edge, engine_cfg, prompts, graded = _pair(pair, n_prompts)
    engine = await VllmEngine(engine_cfg).start()
    rng = random.Random(seed)
    try:
        drafted = []
        for i, p in enumerate(prompts):
            conv = [ChatMessage("user", p)]
            ds = await asyncio.to_thread(edge.generate, edge.render(conv), Sampling(n=5, max_new_tokens=128, seed=i))
            drafted.append((conv, [d for d in ds if d.text.strip()]))
        pool = [w for _, ds in drafted for d in ds for w in d.text.split()]
        good, bad, wrong = [], [], []
        for i, (conv, ds) in enumerate(drafted):
            prompt = engine.render(conv)
            for d in ds:
                right = True if graded is None else graded(i, d.text)
                if right is None:  # failed the rules: the threshold never sees it
                    continue
                scored = [(d.text, good if right else wrong)] + [(corrupt(d.text, pool, rng), bad)] * right
                for text, out in scored:
                    lps = await engine.continuation_logprobs(
                        prompt, text, f"v{i}-{d.index}-{len(out)}", end=d.finish_reason != "length"
                    )
                    if lps:
                        out.append((sum(lps) / len(lps), d.mean_logprob, min(lps)))
    finally:
        await engine.close()
    report = {
        "pair": pair,
        "prompts": len(prompts),
        "good": len(good),
        "bad": len(bad),
        "wrong": len(wrong),
        "median_target_good": sorted(g[0] for g in good)[len(good) // 2],
        "median_target_bad": sorted(b[0] for b in bad)[len(bad) // 2],
        "median_own": sorted(g[1] for g in good)[len(good) // 2],
        "median_least_likely_token_good": sorted(g[2] for g in good)[len(good) // 2],
        "median_least_likely_token_bad": sorted(b[2] for b in bad)[len(bad) // 2],
    }
    report["absolute"] = {str(a): rates(good, bad, lambda t, o, lo, a=a: t >= a) for a in ABSOLUTE}
    report["relative"] = {str(m): rates(good, bad, lambda t, o, lo, m=m: t >= min(-0.5, o - m)) for m in MARGINS}
    # accepted as is (no refinement): the target's mean within ``m`` of the draft model's own and no
    # token below ``tok`` (PolicyConfig.accept_free_text_margin, accept_min_token_logprob)
    report["as_is"] = {
        f"{m}/{tok}": rates(good, bad, lambda t, o, lo, m=m, tok=tok: t >= o - m and lo >= tok)
        for m in (0.1, 0.25, 0.5)
        for tok in AS_IS_TOKEN
    }
    if wrong:  # the draft model's own wrong answers as the bad ones (the demo pair's tasks grade them)
        report["relative_vs_wrong"] = {
            str(m): rates(good, wrong, lambda t, o, lo, m=m: t >= min(-0.5, o - m)) for m in MARGINS
        }
    pc = PolicyConfig()  # its validity rule as it stands: max(floor, min(absolute, own - margin))

    def default(t: float, o: float, lo: float) -> bool:
        return t >= max(pc.min_mean_logprob_floor, min(pc.min_mean_logprob, o - pc.relative_margin))

    report["default"] = {against: rates(good, b, default) for against, b in (("corrupted", bad), ("wrong", wrong)) if b}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument(
        "--pair",
        choices=("real", "demo"),
        default="real",
        help="real: SmolLM2 on both sides (generic prompts); demo: the demo pair on held-out task problems",
    )
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args(argv)
    report = asyncio.run(run(args.prompts, args.seed, args.pair))
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
