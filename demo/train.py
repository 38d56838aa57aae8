"""Train the demo pair: a small draft LM (edge) and a larger target LM (cloud).

Usage::

    python -m coinfer.demo.train                  # retrain both into demo/weights/ (the shipped pair), ~2 h on 2 cores
    python -m coinfer.demo.train --draft          # only the draft (its target must match the recipe), minutes
    python -m coinfer.demo.train --out DIR        # retrain into another directory
    python -m coinfer.demo.train --check          # does the shipped pair match this recipe? (exit 1 if not)
    python -m coinfer.demo.train --eval [--json]  # held-out accuracies of the shipped pair (demo.evaluate)

The pair is trained once and shipped in the repository (``demo/weights/``: safetensors, tokenizers
and ``report.json`` with the keys they were trained under), so every machine runs the same
weights; ``coinfer.demo.models`` loads it and the ONNX / INT8 artefacts are rebuilt from it at install.
Only this module decides when a model must be retrained: each model's key (``model_key``) hashes
its spec, the recipe's data fields, the source of the training functions and a fingerprint of its
training data (rendered examples and the tokenizer corpus), so an edit elsewhere (serving code,
evaluation, a rule) does not invalidate the shipped weights, and a changed generator or template
does; a changed draft spec invalidates the draft alone.

Both are Llama-architecture causal LMs in Hugging Face format with the byte-level BPE
tokenizer and ChatML template of ``coinfer.demo.tokenizer``. They are trained on chat
conversations rendered exactly as the edge and the cloud render them at inference
(``coinfer.chat.ChatFormat``: the generation prompt, then the answer and ``<|im_end|>``),
with the loss on the answer and its closing ``<|im_end|>`` only. Tasks: ``arith`` and
``select`` (``coinfer.tasks``) and English word problems (``coinfer.demo.wordprob``, task name
``words``). Some conversations carry a system message or an earlier exchange. The target
also learns the refinement prompt (``coinfer.chat.refine_question``): the question plus
1-2 candidate solutions, some with a small model's typical mistakes; it answers with the
correct solution. Stage 2 (``coinfer.demo.refine_tune``, ~30 min) then fine-tunes the target on
refinement prompts whose candidates are samples of a small trained model (``Recipe.sampler``: the
first draft recipe); ``target_key`` covers both stages and the sampler, ``pair_key`` (the recorded
key) both models.

Held-out problems: a problem whose prompt hashes to 0 mod 10 is never trained on;
accuracies are measured on those.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect
import json
import logging
import math
import os
import random
import re
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from coinfer.chat import ChatFormat, ChatMessage, refine_question, with_question
from coinfer.cpu import fast_bfloat16
from coinfer.demo import tokenizer as bpe
from coinfer.demo import wordprob
from coinfer.tasks import TASKS, is_held_out

log = logging.getLogger(__name__)
DATA_VERSION = "5"  # bump when the data mix or answer format changes (code changes rebuild anyway)
WORDS = wordprob.TASK


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
    """Everything that determines the trained pair; its keys (``pair_key``, ``draft_key``,
    ``target_key``) are recorded beside the weights."""

    # The draft is small and trained briefly so that it stays fallible (verification must
    # matter): 1800 steps x 32 (~5 min here; held-out greedy 0.31 / 0.23 / 0.33 on arith / select /
    # words). Its accuracy turns sharply with training: the same model after 1200 steps 0.21 / 0.21 /
    # 0.11 (its first drafts rarely carried the answer: a third of split answers came from them), after
    # 2100 and 2400 steps 0.56 and 0.68 on words (over the 0.60 a fallible draft may reach), a 0.97M
    # draft after 3600 steps 0.74 / 0.68 / 0.90 (150 problems each). The target is ~9x larger and trained
    # ~3x longer (5400 x 32, ~90 min on 2 cores, AVX512-BF16), also on refinement prompts. The first
    # recipe gave the target *fewer* examples than the draft (a 12-minute budget for both): it ended
    # weaker than the draft (0.17 vs 0.24 held-out) and refinement halved its accuracy.
    # head_dim = hidden / heads must be one vLLM's CPU backend supports (32, 64).
    # Each model has its own tokenizer (vocabulary caps 640 / 1024: different merges).
    draft: ModelSpec = ModelSpec(
        hidden=96, layers=4, heads=3, intermediate=256, steps=1800, batch=32, seed=1, vocab=640
    )
    target: ModelSpec = ModelSpec(
        hidden=256,
        layers=6,
        heads=4,
        intermediate=640,
        steps=5400,
        batch=32,
        seed=2,
        lr=2e-3,
        warmup=200,
        refine_frac=0.25,
    )
    # Stage 2 (demo.refine_tune) tunes the target on refinement prompts whose candidates are samples
    # of this small model: the first draft recipe (0.57M, 1200 steps; held-out 0.21 / 0.21 / 0.11),
    # kept apart from the shipped draft so that the draft can be retuned alone in minutes
    # (``--draft``) without invalidating the target's two hours. Its mistakes are the ones the
    # target learned to see through; the refinement goal is measured with the shipped draft's.
    sampler: ModelSpec = ModelSpec(
        hidden=96, layers=4, heads=3, intermediate=256, steps=1200, batch=32, seed=1, vocab=640
    )
    tasks: tuple[str, ...] = ("arith", "select", WORDS)
    weights: tuple[float, ...] = (0.3, 0.15, 0.55)
    system_frac: float = 0.2
    history_frac: float = 0.1
    max_positions: int = 1024
    data_version: str = DATA_VERSION
    eval_problems: int = 300
    refine_eval: int = 90  # held-out word problems for refine_accuracy (0 = skip)


BF16_FAST = fast_bfloat16()


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
        return text[: i + 7] + str(int(text[i + 7 :]) + rng.choice((-2, -1, 1, 2, 10)))
    # a number right after '=' or ':' (a step's result), changed a little
    spots = [j + 1 for j, ch in enumerate(text[:i]) if ch in "=:" and text[j + 1 : j + 2].isdigit()]
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


def encode_examples(
    tok, fmt: ChatFormat, examples: list[tuple[list[ChatMessage], str]]
) -> list[tuple[list[int], list[int]]]:
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


def batches(
    rng: random.Random, recipe: Recipe, spec: ModelSpec, tok, fmt: ChatFormat, pool: int = 8
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless right-padded batches; examples are drawn ``pool`` batches at a time and grouped by
    length, which cuts the padding (a refinement prompt is 5x a short arith one)."""
    while True:
        enc = encode_examples(tok, fmt, [make_example(rng, recipe, spec) for _ in range(spec.batch * pool)])
        enc.sort(key=lambda e: len(e[0]))
        groups = [enc[i : i + spec.batch] for i in range(0, len(enc), spec.batch)]
        rng.shuffle(groups)
        for g in groups:
            # lengths rounded up to a multiple of 16: a few dozen distinct shapes instead of hundreds
            # (each new shape costs oneDNN primitives and fragments glibc's heap: steps slowed from
            # 0.7 s to 5 s within 600 steps, the time spent in malloc)
            n = -(-max(len(ids) for ids, _ in g) // 16) * 16
            ids_t = torch.full((len(g), n), bpe.PAD_ID, dtype=torch.long)
            lab_t = torch.full((len(g), n), -100, dtype=torch.long)
            for i, (ids, lab) in enumerate(g):
                ids_t[i, : len(ids)] = torch.tensor(ids)
                lab_t[i, : len(lab)] = torch.tensor(lab)
            yield ids_t, lab_t


# ---------------------------------------------------------------------------------- training


def config_for(spec: ModelSpec, recipe: Recipe, vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        head_dim=spec.hidden // spec.heads,
        max_position_embeddings=recipe.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bpe.BOS_ID,
        eos_token_id=bpe.EOS_ID,
        pad_token_id=bpe.PAD_ID,
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
    return {
        "params": params,
        "train_s": round(train_s, 1),
        "final_loss": round(loss_ewma or 0.0, 4),
        "steps": spec.steps,
        "tokens": tokens,
    }


# ---------------------------------------------------------------------------------- the recipe key

# The functions whose behaviour decides the weights; their source (not the module's: an edit to the
# CLI or to evaluation must not invalidate the shipped pair) is part of the key.
TRAINING_CODE = (
    ModelSpec,
    sample_item,
    corrupt,
    candidates,
    make_example,
    encode_examples,
    batches,
    config_for,
    train_one,
    bpe.build_tokenizer,
    bpe._trained.__wrapped__,
)
FINGERPRINT_EXAMPLES = 256
DATA_FIELDS = ("tasks", "weights", "system_frac", "history_frac", "max_positions", "data_version")
"""The recipe fields every model's training data depends on (the evaluation fields are not among them)."""


def data_fingerprint(recipe: Recipe, spec: ModelSpec) -> str:
    """sha256 of what one model is trained on: the tokenizer corpus and template, and the first
    ``FINGERPRINT_EXAMPLES`` conversations of its stream. A change to a task generator, the
    held-out split, the refinement prompt or the chat template changes it."""
    h = hashlib.sha256()
    h.update("\x1e".join(bpe.corpus()).encode())
    h.update(json.dumps([bpe.SPECIALS, bpe.CHAT_TEMPLATE, bpe.SYSTEM_PROMPTS]).encode())
    rng = random.Random(spec.seed)
    for _ in range(FINGERPRINT_EXAMPLES):
        messages, answer = make_example(rng, recipe, spec)
        h.update(json.dumps([[m.role, m.content] for m in messages] + [answer]).encode())
    return h.hexdigest()


def code_text(fn) -> str:
    """``fn``'s code as the keys hash it: its syntax tree (``ast.dump``), so that what the code does is
    hashed and not how it is laid out or commented (``ruff format`` rewrote the training code's layout
    and nothing else: the text-hashed key changed while the recipe had not), with the project's own
    modules named by their folders (``coinfer.demo.evaluate`` as ``demo.evaluate``): where a module is
    installed is packaging, not training (the pair was trained before the folders moved under the
    ``coinfer`` namespace). The shipped pair's keys were restated once for this: the trees of its
    training code before the format (f7433be) and after it hash alike."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return re.sub(r"\bcoinfer\.(edge|cloud|quantize|demo)\b", r"\1", ast.dump(tree))


def model_key(spec: ModelSpec, recipe: Recipe | None = None) -> str:
    """What one stage-1 model's weights depend on (16 hex): its spec, the data fields of the recipe,
    the training code and the fingerprint of its data -- not the other model's spec, so that either
    can be retrained alone."""
    recipe = recipe or Recipe()
    fields = {"spec": asdict(spec), **{f: getattr(recipe, f) for f in DATA_FIELDS}}
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for fn in TRAINING_CODE:
        h.update(code_text(fn).encode())
    h.update(data_fingerprint(recipe, spec).encode())
    return h.hexdigest()[:16]


def draft_key(recipe: Recipe | None = None) -> str:
    """The key the shipped draft records."""
    recipe = recipe or Recipe()
    return model_key(recipe.draft, recipe)


def target_key(recipe: Recipe | None = None) -> str:
    """The key the shipped target records: its stage 1 and the sampler whose samples stage 2 tunes it
    on, extended by stage 2 (``coinfer.demo.refine_tune``)."""
    from coinfer.demo.refine_tune import RefineTune, stage2_key

    recipe = recipe or Recipe()
    stage1 = hashlib.sha256(f"{model_key(recipe.target, recipe)}:{model_key(recipe.sampler, recipe)}".encode())
    return stage2_key(stage1.hexdigest()[:16], RefineTune())


def _pair_of(draft: str, target: str) -> str:
    return hashlib.sha256(f"{draft}:{target}".encode()).hexdigest()[:16]


def pair_key(recipe: Recipe | None = None) -> str:
    """The key the shipped pair records: both models' keys."""
    return _pair_of(draft_key(recipe), target_key(recipe))


def _keys(recipe: Recipe) -> dict[str, str]:
    """The three keys a report records, each model's computed once (a data fingerprint costs seconds)."""
    d, t = draft_key(recipe), target_key(recipe)
    return {"key": _pair_of(d, t), "draft_key": d, "target_key": t}


# ---------------------------------------------------------------------------------- the pair

DRAFT_TASKS = ["arith", "select"]
"""The built-in tasks the draft was trained on (its word problems are open requests): declared in its
config.json (``coinfer_tasks``), so the quantize CLI gates its task accuracy on them by default."""


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file of a trained pair except the report (which records these)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "report.json"
    }


def _train_draft(root: Path, recipe: Recipe, report: dict) -> None:
    """Train the draft into ``root/draft`` and declare its built-in tasks in its config.json."""
    report["draft"], report["tokenizer"]["vocab_draft"] = _train_model("draft", recipe.draft, recipe, root / "draft")
    cfg_path = root / "draft" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["coinfer_tasks"] = DRAFT_TASKS
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def _train_model(name: str, spec: ModelSpec, recipe: Recipe, out: Path) -> tuple[dict, int]:
    """One model with its own tokenizer (vocabulary ``spec.vocab``) into ``out``: its stats, its vocabulary size."""
    tok_dir = Path(tempfile.mkdtemp(prefix=f"tokenizer-{name}-"))
    try:
        tok = bpe.save(tok_dir, spec.vocab)
        return train_one(name, spec, recipe, out, tok_dir), len(tok)
    finally:
        shutil.rmtree(tok_dir, ignore_errors=True)


def train_pair(out: Path, recipe: Recipe | None = None) -> dict:
    """Train the draft and the target into ``out/draft`` and ``out/target`` (built in a temp dir
    beside ``out`` and renamed: never a half-written pair) with ``out/report.json``."""
    recipe = recipe or Recipe()
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        t0 = time.perf_counter()
        torch.set_num_threads(os.cpu_count() or 1)
        report: dict = {
            **_keys(recipe),
            "recipe": asdict(recipe),
            "bf16_autocast": BF16_FAST,
            "torch": torch.__version__,
        }
        report["tokenizer"] = {"bos": bpe.BOS_ID, "eos": bpe.EOS_ID, "im_start": bpe.IM_START_ID, "pad": bpe.PAD_ID}
        report["target"], report["tokenizer"]["vocab_target"] = _train_model(
            "target", recipe.target, recipe, tmp / "target"
        )
        sampler = tmp / "sampler"
        # stage 2's candidates come from the sampler (a small model trained as the first draft recipe
        # was); it is the shipped draft only where the recipe says so
        report["sampler"], _ = _train_model("sampler", recipe.sampler, recipe, sampler)
        report["refine_tune"] = _stage2(tmp, sampler, recipe)
        shutil.rmtree(sampler)
        _train_draft(tmp, recipe, report)
        report["train_total_s"] = round(time.perf_counter() - t0, 1)
        _publish(tmp, out, report)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report


def _publish(tmp: Path, out: Path, report: dict) -> None:
    """Record the files' digests in ``tmp/report.json`` and put ``tmp`` in ``out``'s place."""
    report["files"] = file_digests(tmp)
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def _stage2(pair: Path, sampler: Path, recipe: Recipe) -> dict:
    from coinfer.demo.refine_tune import RefineTune, tune_target

    tune = RefineTune()
    return {"config": asdict(tune), **tune_target(pair / "target", sampler, recipe, tune)}


def retrain_draft(pair: Path, recipe: Recipe | None = None) -> dict:
    """Retrain the draft alone (minutes, not the target's two hours) in a pair whose target was trained
    under the current recipe (its report's ``target_key``): what ``train_pair`` would produce, since
    the target's training depends on the sampler, never on the draft. Rewritten via a temp copy."""
    recipe = recipe or Recipe()
    pair = pair.resolve()
    report = json.loads((pair / "report.json").read_text())
    if report.get("target_key") != target_key(recipe):
        raise SystemExit(
            f"{pair}: the target was trained under {report.get('target_key')}, the recipe's target is "
            f"{target_key(recipe)}: retrain both (python -m coinfer.demo.train)"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{pair.name}-", dir=pair.parent))
    try:
        shutil.copytree(pair, tmp, dirs_exist_ok=True)
        shutil.rmtree(tmp / "draft")
        torch.set_num_threads(os.cpu_count() or 1)
        report.pop("eval", None)
        before = report["draft"]["train_s"]
        report.update({**_keys(recipe), "recipe": asdict(recipe)})
        _train_draft(tmp, recipe, report)
        report["train_total_s"] = round(report["train_total_s"] - before + report["draft"]["train_s"], 1)
        _publish(tmp, pair, report)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report


SHIPPED = Path(__file__).resolve().parent / "weights"
"""Where the shipped pair lives (committed): ``draft/``, ``target/``, ``report.json``."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", type=Path, default=SHIPPED, help="where to write the trained pair (default: the shipped one)"
    )
    ap.add_argument("--check", action="store_true", help="only check that the pair at --out matches this recipe")
    ap.add_argument("--eval", action="store_true", help="only evaluate the pair at --out on held-out problems")
    ap.add_argument("--no-eval", action="store_true", help="train without evaluating afterwards")
    ap.add_argument(
        "--draft",
        action="store_true",
        help="only retrain the draft of the pair at --out, whose target must match the recipe (minutes)",
    )
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.check:
        recorded, key = json.loads((args.out / "report.json").read_text())["key"], pair_key()
        ok = recorded == key
        print(f"{args.out}: recorded key {recorded}, recipe key {key}: {'match' if ok else 'RETRAIN NEEDED'}")
        return 0 if ok else 1
    from coinfer.demo import evaluate

    if args.eval:
        return evaluate.main(["--models", str(args.out)] + (["--json"] if args.json else []))
    report = retrain_draft(args.out) if args.draft else train_pair(args.out)
    if not args.no_eval:
        report["eval"] = evaluate.evaluate_pair(args.out / "draft", args.out / "target", Recipe())
        (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2) if args.json else f"trained pair at {args.out} in {report['train_total_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
