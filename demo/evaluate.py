"""Held-out accuracy of a demo pair: each model alone, and the target refining the draft's candidates.

Usage::

    python -m coinfer.demo.evaluate                   # the shipped pair (demo/weights), ~4 min on 2 cores
    python -m coinfer.demo.evaluate --models DIR --json

Greedy (transformers ``generate``, float32) on held-out problems (``coinfer.tasks.is_held_out``) of
every task, graded exactly. The goals the pair is trained for: the target at least 20 points above
the draft on each task and at least 60% on words; the draft at most 60% on words (it must stay
fallible, so that verification matters); the target refining 3 sampled drafts at least as good as
the target alone.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from coinfer.chat import ChatFormat, ChatMessage, refine_question
from coinfer.demo import tokenizer as bpe
from coinfer.demo.train import SHIPPED, WORDS, Item, Recipe, grade, sample_item


def _generate(
    model, tok, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, n: int = 1, chunk: int = 64
) -> list[list[str]]:
    """Completions (``n`` each) of chat-rendered ``prompts``, batched by length."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[str]] = [[] for _ in prompts]
    gen = dict(do_sample=True, temperature=temperature, top_k=0) if temperature > 0 else dict(do_sample=False)
    for s in range(0, len(order), chunk):
        idx = order[s : s + chunk]
        enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
        rows = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            pad_token_id=bpe.PAD_ID,
            eos_token_id=bpe.EOS_ID,
            **gen,
        )
        rows = rows[:, enc["input_ids"].shape[1] :]
        for j, i in enumerate(idx):
            out[i] = [tok.decode(r, skip_special_tokens=True) for r in rows[j * n : (j + 1) * n]]
    return out


def _load(model_dir: Path):
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    return tok, ChatFormat.from_dir(model_dir), LlamaForCausalLM.from_pretrained(str(model_dir)).eval()


def held_out_items(recipe: Recipe, n: int, seed: int, tasks: tuple[str, ...] | None = None) -> list[Item]:
    rng = random.Random(seed)
    tasks = tasks or recipe.tasks
    return [sample_item(rng, tasks[i % len(tasks)], held_out=True) for i in range(n)]


MAX_NEW_TOKENS = 96


@torch.no_grad()
def accuracy(model_dir: Path, recipe: Recipe, n: int | None = None, temperature: float = 0.0, seed: int = 1234) -> dict:
    """Single-sample accuracy on held-out problems (chat-rendered, one user turn), per task and overall."""
    tok, fmt, model = _load(model_dir)
    items = held_out_items(recipe, n or recipe.eval_problems, seed)
    torch.manual_seed(seed)
    prompts = [fmt.render([ChatMessage("user", it.question)]) for it in items]
    texts = _generate(model, tok, prompts, MAX_NEW_TOKENS, temperature)
    correct: dict[str, list[int]] = {t: [] for t in recipe.tasks}
    for it, (text,) in zip(items, texts):
        correct[it.task].append(int(grade(it, text)))
    per_task = {t: round(sum(c) / max(1, len(c)), 3) for t, c in correct.items()}
    total = [x for c in correct.values() for x in c]
    return {"overall": round(sum(total) / len(total), 3), **per_task, "n": len(total), "temperature": temperature}


@torch.no_grad()
def refine_accuracy(
    draft_dir: Path,
    target_dir: Path,
    recipe: Recipe,
    n: int | None = None,
    k: int = 3,
    temperature: float = 0.7,
    seed: int = 4321,
) -> dict:
    """The target on held-out word problems, alone (greedy) and refining ``k`` sampled drafts of the
    draft model (the cloud's refinement prompt), on the same problems."""
    items = held_out_items(recipe, n or recipe.refine_eval, seed, tasks=(WORDS,))
    torch.manual_seed(seed)
    dtok, dfmt, dmodel = _load(draft_dir)
    drafts = _generate(
        dmodel,
        dtok,
        [dfmt.render([ChatMessage("user", it.question)]) for it in items],
        MAX_NEW_TOKENS,
        temperature,
        n=k,
    )
    del dmodel
    ttok, tfmt, tmodel = _load(target_dir)
    alone = _generate(tmodel, ttok, [tfmt.render([ChatMessage("user", it.question)]) for it in items], MAX_NEW_TOKENS)
    refined = _generate(
        tmodel,
        ttok,
        [tfmt.render([ChatMessage("user", refine_question(it.question, d))]) for it, d in zip(items, drafts)],
        MAX_NEW_TOKENS,
        chunk=32,
    )

    chosen, todo, verified, raw = _as_the_cloud_does(tmodel, ttok, tfmt, items, drafts, [t[0] for t in alone])

    def rate(xs) -> float:
        return round(sum(xs) / max(1, len(xs)), 3)

    return {
        "refine_verified_accuracy": rate([grade(it, t) for it, t in zip(items, verified)]),
        "refine_raw_accuracy": rate([grade(it, t) for it, t in zip(items, raw)]),
        "refinements_rejected": sum(verified[i] is not raw[i] for i in todo),  # cloud_answer kept the candidate
        "refined_share": rate([bool(c) for c in chosen]),
        "refine_accuracy": rate([grade(it, t[0]) for it, t in zip(items, refined)]),
        "target_greedy": rate([grade(it, t[0]) for it, t in zip(items, alone)]),
        "draft_sample": rate([grade(it, x) for it, d in zip(items, drafts) for x in d]),
        "draft_any_of_k": rate([any(grade(it, x) for x in d) for it, d in zip(items, drafts)]),
        "n": len(items),
        "k": k,
        "draft_temperature": temperature,
    }


def _as_the_cloud_does(tmodel, ttok, tfmt, items, drafts, alone: list[str]):
    """Refinement as the cloud does it: only drafts that pass the rules (marker extraction, every equation right)
    and the likelihood threshold are candidates (the best 2 by mean logprob); none: the target alone. A
    refinement that fails the rules is withdrawn and the best candidate returned (cloud.answering's
    Answerer._refined); "raw" holds the refinements as written. Returns (candidates per item, the items
    refined, the answers, the raw answers)."""
    rules = _rules()
    chosen = [_verified(tmodel, ttok, tfmt, it, d, rules) for it, d in zip(items, drafts)]
    todo = [i for i, c in enumerate(chosen) if c]
    via = _generate(
        tmodel,
        ttok,
        [tfmt.render([ChatMessage("user", refine_question(items[i].question, chosen[i]))]) for i in todo],
        MAX_NEW_TOKENS,
        chunk=32,
    )
    verified, raw = list(alone), list(alone)
    for i, (t,) in zip(todo, via):
        raw[i] = t
        verified[i] = cloud_answer(t, chosen[i], rules)
    return chosen, todo, verified, raw


def cloud_answer(refinement: str, candidates: list[str], rules) -> str:
    """What the cloud returns for a refinement of verified ``candidates`` (best first): the
    refinement when it passes the rules, else the best candidate (``coinfer.cloud.answering.Answerer._refined``)."""
    return refinement if rules.check(refinement)[0].valid else candidates[0]


def _rules():
    """The rules the cloud checks an open word problem's answers with (the demo's task spec)."""
    from coinfer.extract import Extraction
    from coinfer.rules import Rule, RuleSet
    from coinfer.tasks import OPEN

    return RuleSet([Rule("arithmetic")], OPEN, {}, extraction=Extraction("marker"))


@torch.no_grad()
def _verified(model, tok, fmt: ChatFormat, item: Item, drafts: list[str], rules, keep: int = 2) -> list[str]:
    """The drafts the cloud would refine from (``coinfer.cloud.judging``: rules, then the likelihood
    threshold, best ``keep`` by the target's mean per-token logprob, duplicates merged)."""
    from coinfer.cloud.config import PolicyConfig

    prompt = fmt.render([ChatMessage("user", item.question)])
    scored = {}
    for d in dict.fromkeys(x.strip() for x in drafts):
        if not d or not rules.check(d)[0].valid:
            continue
        enc = tok(
            prompt + d + tok.eos_token, return_offsets_mapping=True, add_special_tokens=False, return_tensors="pt"
        )
        start = next(i for i, (_, end) in enumerate(enc["offset_mapping"][0].tolist()) if end > len(prompt))
        ids = enc["input_ids"]
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        lps = logp[torch.arange(start - 1, ids.shape[1] - 1), ids[0, start:]]
        if lps.numel() and lps.mean().item() >= PolicyConfig().min_mean_logprob:
            scored[d] = lps.mean().item()
    return sorted(scored, key=lambda k: -scored[k])[:keep]


def goals(ev: dict) -> dict[str, bool]:
    """The pair's goals (see the module docstring), each True when met."""
    d, tg, r = ev["draft"], ev["target"], ev["refine"]
    out = {f"target >= draft + 0.20 on {t}": tg[t] >= d[t] + 0.20 for t in Recipe().tasks}
    out["target >= 0.60 on words"] = tg[WORDS] >= 0.60
    out["draft <= 0.60 on words"] = d[WORDS] <= 0.60
    out["refine (verified candidates, as the cloud) >= target alone"] = (
        r["refine_verified_accuracy"] >= r["target_greedy"]
    )
    return out


def evaluate_pair(draft: Path, target: Path, recipe: Recipe) -> dict:
    ev = {"draft": accuracy(draft, recipe), "target": accuracy(target, recipe)}
    if recipe.refine_eval:
        ev["refine"] = refine_accuracy(draft, target, recipe)
    ev["goals"] = goals(ev) if "refine" in ev else {}
    return ev


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=SHIPPED, help="a pair's directory (draft/, target/)")
    ap.add_argument("--json", action="store_true", help="print the evaluation as JSON")
    args = ap.parse_args(argv)
    ev = evaluate_pair(args.models / "draft", args.models / "target", Recipe())
    if args.json:
        print(json.dumps(ev, indent=2))
    else:
        for name in ("draft", "target"):
            print(f"{name}: {ev[name]}")
        print(f"refine: {ev['refine']}")
        for goal, ok in ev["goals"].items():
            print(f"  {'met ' if ok else 'MISS'}  {goal}")
    return 0 if all(ev["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
