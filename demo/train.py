"""Build the demo models offline: a small draft LM (edge) and a larger target LM (cloud).

Usage::

    python -m demo.train                 # build (or reuse) both models, print accuracies
    python -m demo.train --json          # the same, machine-readable
    python -m demo.train --force         # rebuild even if cached

Both are Llama-architecture causal LMs in Hugging Face format with the byte-level BPE
tokenizer and ChatML template of ``demo.tokenizer``. They are trained on chat
conversations rendered exactly as the edge and the cloud render them at inference
(``coinfer.chat.ChatFormat``: the generation prompt, then the answer and ``<|im_end|>``),
with the loss on the answer and its closing ``<|im_end|>`` only. Tasks: ``arith`` and
``select`` (``coinfer.tasks``) and English word problems (``demo.wordprob``, task name
``words``). Some conversations carry a system message or an earlier exchange. The target
also learns the refinement prompt (``coinfer.chat.refine_question``): the question plus
1-3 candidate solutions, some with a small model's typical mistakes; it answers with the
correct solution.

The result is cached under ``$XDG_CACHE_HOME/coinfer/models/<recipe key>/`` (default
``~/.cache``): the key hashes the recipe and the source of the code that builds the
models, so a changed recipe or generator builds afresh and an unchanged one is reused by
the demo, the tests and CI.

Held-out problems: a problem whose prompt hashes to 0 mod 10 is never trained on;
accuracies are measured on those.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from coinfer.chat import ChatFormat, ChatMessage, refine_question, with_question
from coinfer.tasks import TASKS, is_held_out
from demo import tokenizer as bpe
from demo import wordprob

log = logging.getLogger(__name__)
DATA_VERSION = "5"  # bump when the data mix or answer format changes (code changes rebuild anyway)
WORDS = wordprob.TASK
_ROOT = Path(__file__).resolve().parents[1]
# the code that determines the built models: its source is part of the cache key
SOURCES = ("demo/train.py", "demo/tokenizer.py", "demo/wordprob.py", "coinfer/tasks/*.py", "coinfer/chat.py")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture and training budget of one demo model."""

    hidden: int
    layers: int
    heads: int  # head_dim = hidden / heads must be one vLLM's CPU backend supports (32, 64)
    intermediate: int
    steps: int
    lr: float = 3e-3
    batch: int = 64
    warmup: int = 60
    seed: int = 0
    refine_frac: float = 0.0  # share of examples that are refinement prompts (the target's)
    vocab: int = 1024  # BPE vocabulary cap of this model's own tokenizer


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the built models; its hash (plus the code's) is the cache key."""

    # Sized for a 2-core CPU (tokenizer + both models + evaluation in ~12 minutes). The draft
    # is kept deliberately fallible so that verification matters; the target is larger,
    # trained longer and also on refinement prompts.
    # Small batches, many updates: at this budget the number of updates, not the batch, limits
    # learning (the models must learn to copy numbers from the question).
    # Measured here (AVX512-BF16, 2 cores): examples seen, not updates, limit learning -- the
    # draft at 1200 steps x 32 (38k examples, 200 s) reaches 0.26 on held-out words, at 900 x 16
    # (14k) 0.06. Word problems carry most of the weight: they are the open task of the demo.
    # Each model has its own tokenizer (vocabulary caps 640 / 1024: different merges).
    draft: ModelSpec = ModelSpec(hidden=96, layers=4, heads=3, intermediate=256, steps=1200, batch=32, seed=1,
                                 vocab=640)
    target: ModelSpec = ModelSpec(hidden=160, layers=5, heads=5, intermediate=448, steps=900, batch=32, seed=2,
                                  lr=2.5e-3, refine_frac=0.25)
    tasks: tuple[str, ...] = ("arith", "select", WORDS)
    weights: tuple[float, ...] = (0.25, 0.15, 0.6)
    system_frac: float = 0.2
    history_frac: float = 0.1
    max_positions: int = 1024
    data_version: str = DATA_VERSION
    eval_problems: int = 300
    refine_eval: int = 90  # held-out word problems for refine_accuracy (0 = skip)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def key(self) -> str:
        blob = json.dumps({k: v for k, v in asdict(self).items() if k != "extra"}, sort_keys=True)
        return hashlib.sha256((blob + code_hash()).encode()).hexdigest()[:16]


def code_hash() -> str:
    h = hashlib.sha256()
    for pattern in SOURCES:
        for p in sorted(_ROOT.glob(pattern)):
            h.update(str(p.relative_to(_ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


BF16_FAST = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "coinfer" / "models"


# ---------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Item:
    """One problem of any task: the question (user turn), its reference solution, how to grade."""

    task: str
    question: str
    solution: str
    truth: object  # words: the int answer; coinfer tasks: the spec


def sample_item(rng: random.Random, task: str, held_out: bool) -> Item:
    while True:
        if task == WORDS:
            w = wordprob.generate(rng)
            item = Item(task, w.prompt, w.solution, w.answer)
        else:
            p = TASKS[task].generate(rng)
            item = Item(task, p.prompt, TASKS[task].solve(p.spec), p.spec)
        if is_held_out(item.question) == held_out:
            return item


def grade(item: Item, text: str) -> bool:
    if item.task == WORDS:
        return wordprob.grade(text, item.truth)
    task = TASKS[item.task]
    return task.grade(item.truth, task.parse_answer(text))


def corrupt(item: Item, rng: random.Random) -> str:
    """A wrong candidate like a small model's: see ``wordprob.corrupt``; for the task formats a
    step's number off by a little, a wrong final answer, or a truncated answer."""
    if item.task == WORDS:
        return wordprob.corrupt(item.solution, rng)
    text = item.solution
    kind = rng.choice(("num", "num", "answer", "truncate"))
    i = text.rfind("answer ")
    if kind == "truncate" or i < 0:
        return text[: rng.randint(max(1, len(text) // 4), max(2, len(text) - 3))].rstrip()
    if kind == "answer":
        if item.task == "select":
            pool = list(item.truth["pool"])
            return text[: i + 7] + ",".join(sorted(rng.sample(pool, item.truth["k"])))
        return text[: i + 7] + str(int(text[i + 7:]) + rng.choice((-2, -1, 1, 2, 10)))
    # a number right after '=' or ':' (a step's result), changed a little
    spots = [j + 1 for j, ch in enumerate(text[:i]) if ch in "=:" and text[j + 1: j + 2].isdigit()]
    if not spots:
        return text[:i] + "answer 0"
    s = rng.choice(spots)
    e = s
    while e < len(text) and text[e].isdigit():
        e += 1
    return text[:s] + str(max(0, int(text[s:e]) + rng.choice((-2, -1, 1, 2)))) + text[e:]


def candidates(item: Item, rng: random.Random) -> list[str]:
    """1-2 candidates (the cloud's default context_drafts is 2); each right with p=0.35, so sometimes
    all are wrong, sometimes one is right."""
    return [item.solution if rng.random() < 0.35 else corrupt(item, rng) for _ in range(rng.randint(1, 2))]


def make_example(rng: random.Random, recipe: Recipe, spec: ModelSpec) -> tuple[list[ChatMessage], str]:
    """A training conversation (ending in the user's turn) and the assistant's answer."""
    task = rng.choices(recipe.tasks, recipe.weights)[0]
    item = sample_item(rng, task, held_out=False)
    messages: list[ChatMessage] = []
    if rng.random() < recipe.system_frac:
        messages.append(ChatMessage("system", rng.choice(bpe.SYSTEM_PROMPTS)))
    if rng.random() < recipe.history_frac:
        prev = sample_item(rng, rng.choices(recipe.tasks, recipe.weights)[0], held_out=False)
        messages += [ChatMessage("user", prev.question), ChatMessage("assistant", prev.solution)]
    messages.append(ChatMessage("user", item.question))
    if rng.random() < spec.refine_frac:
        messages = with_question(messages, refine_question(item.question, candidates(item, rng)))
    return messages, item.solution


def encode_examples(tok, fmt: ChatFormat, examples: list[tuple[list[ChatMessage], str]]) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels of each rendered conversation: the full text is tokenized once
    (canonical BPE, as at inference) and the labels (answer + <|im_end|>) come from offsets."""
    texts, starts = [], []
    for messages, answer in examples:
        head = fmt.render(messages, add_generation_prompt=True)
        texts.append(head + answer + tok.eos_token)
        starts.append(len(head))
    enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for ids, offs, start in zip(enc["input_ids"], enc["offset_mapping"], starts):
        labels = [t if a >= start else -100 for t, (a, _) in zip(ids, offs)]
        out.append((ids, labels))
    return out


def batches(rng: random.Random, recipe: Recipe, spec: ModelSpec, tok, fmt: ChatFormat,
            pool: int = 8) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless right-padded batches; examples are drawn ``pool`` batches at a time and grouped by
    length, which cuts the padding (a refinement prompt is 5x a short arith one)."""
    while True:
        enc = encode_examples(tok, fmt, [make_example(rng, recipe, spec) for _ in range(spec.batch * pool)])
        enc.sort(key=lambda e: len(e[0]))
        groups = [enc[i: i + spec.batch] for i in range(0, len(enc), spec.batch)]
        rng.shuffle(groups)
        for g in groups:
            n = max(len(ids) for ids, _ in g)
            ids_t = torch.full((len(g), n), bpe.PAD_ID, dtype=torch.long)
            lab_t = torch.full((len(g), n), -100, dtype=torch.long)
            for i, (ids, lab) in enumerate(g):
                ids_t[i, : len(ids)] = torch.tensor(ids)
                lab_t[i, : len(lab)] = torch.tensor(lab)
            yield ids_t, lab_t


# ---------------------------------------------------------------------------------- training


def config_for(spec: ModelSpec, recipe: Recipe, vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        head_dim=spec.hidden // spec.heads, max_position_embeddings=recipe.max_positions,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=bpe.BOS_ID, eos_token_id=bpe.EOS_ID, pad_token_id=bpe.PAD_ID,
        torch_dtype="float32",
    )


def train_one(name: str, spec: ModelSpec, recipe: Recipe, out: Path, tok_dir: Path) -> dict:
    """Train one model into ``out`` (HF format + tokenizer); returns stats."""
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    fmt = ChatFormat.from_dir(tok_dir)
    model = LlamaForCausalLM(config_for(spec, recipe, len(tok)))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step: int) -> float:  # linear warm-up then cosine to 10%
        if step < spec.warmup:
            return spec.lr * (step + 1) / spec.warmup
        t = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
        return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))

    stream = batches(rng, recipe, spec, tok, fmt)
    t0, loss_ewma, tokens = time.perf_counter(), None, 0
    bar = tqdm(range(spec.steps), desc=f"train {name} ({params / 1e6:.2f}M)", unit="step", file=sys.stderr)
    model.train()
    for step in bar:
        ids, labels = next(stream)
        tokens += ids.numel()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        # bf16 autocast: ~2x faster matmuls where the CPU has bf16 instructions (master
        # weights stay fp32); without them (AVX2-only, e.g. some AMD EPYC hosts) torch
        # falls back to a scalar bf16 GEMM ~15x slower than fp32, so train in fp32 there.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16_FAST):
            loss = model(input_ids=ids, attention_mask=(ids != bpe.PAD_ID).long(), labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ewma = loss.item() if loss_ewma is None else 0.95 * loss_ewma + 0.05 * loss.item()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss_ewma:.3f}")
    train_s = time.perf_counter() - t0
    model.eval()
    model.generation_config.eos_token_id = bpe.EOS_ID
    model.generation_config.bos_token_id = bpe.BOS_ID
    model.generation_config.pad_token_id = bpe.PAD_ID
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return {"params": params, "train_s": round(train_s, 1), "final_loss": round(loss_ewma or 0.0, 4),
            "steps": spec.steps, "tokens": tokens}


# ---------------------------------------------------------------------------------- evaluation


def _generate(model, tok, prompts: list[str], max_new_tokens: int, temperature: float = 0.0,
              n: int = 1, chunk: int = 64) -> list[list[str]]:
    """Completions (``n`` each) of chat-rendered ``prompts``, batched by length."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[str]] = [[] for _ in prompts]
    gen = dict(do_sample=True, temperature=temperature, top_k=0) if temperature > 0 else dict(do_sample=False)
    for s in range(0, len(order), chunk):
        idx = order[s: s + chunk]
        enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
        rows = model.generate(**enc, max_new_tokens=max_new_tokens, num_return_sequences=n,
                              pad_token_id=bpe.PAD_ID, eos_token_id=bpe.EOS_ID, **gen)
        rows = rows[:, enc["input_ids"].shape[1]:]
        for j, i in enumerate(idx):
            out[i] = [tok.decode(r, skip_special_tokens=True) for r in rows[j * n: (j + 1) * n]]
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
def refine_accuracy(draft_dir: Path, target_dir: Path, recipe: Recipe, n: int | None = None, k: int = 3,
                    temperature: float = 0.7, seed: int = 4321) -> dict:
    """The target on held-out word problems, alone (greedy) and refining ``k`` sampled drafts of the
    draft model (the cloud's refinement prompt), on the same problems."""
    items = held_out_items(recipe, n or recipe.refine_eval, seed, tasks=(WORDS,))
    torch.manual_seed(seed)
    dtok, dfmt, dmodel = _load(draft_dir)
    drafts = _generate(dmodel, dtok, [dfmt.render([ChatMessage("user", it.question)]) for it in items],
                       MAX_NEW_TOKENS, temperature, n=k)
    del dmodel
    ttok, tfmt, tmodel = _load(target_dir)
    alone = _generate(tmodel, ttok, [tfmt.render([ChatMessage("user", it.question)]) for it in items], MAX_NEW_TOKENS)
    refined = _generate(tmodel, ttok, [tfmt.render([ChatMessage("user", refine_question(it.question, d))])
                                       for it, d in zip(items, drafts)], MAX_NEW_TOKENS, chunk=32)

    def rate(xs) -> float:
        return round(sum(xs) / max(1, len(xs)), 3)

    return {
        "refine_accuracy": rate([grade(it, t[0]) for it, t in zip(items, refined)]),
        "target_greedy": rate([grade(it, t[0]) for it, t in zip(items, alone)]),
        "draft_sample": rate([grade(it, x) for it, d in zip(items, drafts) for x in d]),
        "draft_any_of_k": rate([any(grade(it, x) for x in d) for it, d in zip(items, drafts)]),
        "n": len(items), "k": k, "draft_temperature": temperature,
    }


# ---------------------------------------------------------------------------------- cache


@dataclass
class DemoModels:
    """Paths of a built model pair and its build report."""

    root: Path
    draft: Path
    target: Path
    report: dict


def ensure_models(recipe: Recipe | None = None, force: bool = False) -> DemoModels:
    """Build the demo models unless a build for this recipe is cached; return their paths."""
    recipe = recipe or Recipe()
    root = cache_root() / recipe.key()
    report_path = root / "report.json"
    if report_path.exists() and not force:
        return DemoModels(root, root / "draft", root / "target", json.loads(report_path.read_text()))
    root.parent.mkdir(parents=True, exist_ok=True)
    # build in a temp dir beside the final one, rename at the end: never a half-built cache
    tmp = Path(tempfile.mkdtemp(prefix=f".{recipe.key()}-", dir=root.parent))
    try:
        t0 = time.perf_counter()
        torch.set_num_threads(os.cpu_count() or 1)
        report: dict = {"recipe": asdict(recipe), "key": recipe.key()}
        report["tokenizer"] = {"bos": bpe.BOS_ID, "eos": bpe.EOS_ID, "im_start": bpe.IM_START_ID, "pad": bpe.PAD_ID}
        for name in ("draft", "target"):
            spec = getattr(recipe, name)
            tok = bpe.save(tmp / f"tokenizer-{name}", spec.vocab)
            report["tokenizer"][f"vocab_{name}"] = len(tok)
            report[name] = train_one(name, spec, recipe, tmp / name, tmp / f"tokenizer-{name}")
        report["train_total_s"] = round(time.perf_counter() - t0, 1)
        for name in ("draft", "target"):
            report[name]["accuracy"] = accuracy(tmp / name, recipe)
        if recipe.refine_eval:
            report["target"]["refine"] = refine_accuracy(tmp / "draft", tmp / "target", recipe)
            report["target"]["refine_accuracy"] = report["target"]["refine"]["refine_accuracy"]
        report["build_s"] = round(time.perf_counter() - t0, 1)
        (tmp / "report.json").write_text(json.dumps(report, indent=2))
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return DemoModels(root, root / "draft", root / "target", report)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    ap.add_argument("--json", action="store_true", help="print the build report as JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    models = ensure_models(force=args.force)
    if args.json:
        print(json.dumps({"root": str(models.root), **models.report}, indent=2))
    else:
        r = models.report
        print(f"models at {models.root} (built in {r['build_s']} s)")
        for name in ("draft", "target"):
            m = r[name]
            print(f"  {name}: {m['params'] / 1e6:.2f}M params, {m['train_s']} s, held-out accuracy {m['accuracy']}")
        if "refine" in r["target"]:
            print(f"  target refining draft candidates (held-out words): {r['target']['refine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
