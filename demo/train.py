"""Build the demo models offline: a small draft LM (edge) and a larger target LM (cloud).

Usage::

    python -m demo.train                 # build (or reuse) both models, print accuracies
    python -m demo.train --json          # the same, machine-readable
    python -m demo.train --force         # rebuild even if cached

Both are Llama-architecture causal LMs in Hugging Face format with the
character-level tokenizer of ``demo.tokenizer``, trained from the built-in task
generators (``arith`` and ``select``) with the loss on the answer only. The
result is cached under ``$XDG_CACHE_HOME/coinfer/models/<recipe key>/`` (default
``~/.cache``): the key hashes the recipe, so a changed recipe builds afresh and
an unchanged one is reused by the demo, the tests and CI.

Held-out problems: a problem whose prompt hashes to 0 mod 10 is never trained
on; accuracies are measured on those.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from coinfer.tasks import TASKS, Problem, problems
from demo import tokenizer as chartok

log = logging.getLogger(__name__)
DATA_VERSION = "4"  # bump when a task generator or answer format changes


@dataclass(frozen=True)
class ModelSpec:
    """Architecture and training budget of one demo model."""

    hidden: int
    layers: int
    heads: int  # head_dim = hidden / heads must be one vLLM's CPU backend supports (32, 64, ...)
    intermediate: int
    steps: int
    lr: float = 3e-3
    batch: int = 64
    warmup: int = 100
    seed: int = 0


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the built models; its hash is the cache key."""

    # Sized for a 2-core CPU: both build in under 10 minutes. The draft is kept
    # deliberately fallible (30-70% held-out accuracy) so that verification matters;
    # the target is ~3x larger and trained longer.
    draft: ModelSpec = ModelSpec(hidden=96, layers=4, heads=3, intermediate=256, steps=500, seed=1)
    target: ModelSpec = ModelSpec(hidden=128, layers=6, heads=4, intermediate=384, steps=540, seed=2)
    tasks: tuple[str, ...] = ("arith", "select")
    max_positions: int = 256
    data_version: str = DATA_VERSION
    eval_problems: int = 400
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def key(self) -> str:
        blob = json.dumps({k: v for k, v in asdict(self).items() if k != "extra"}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


BF16_FAST = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "coinfer" / "models"


def make_batch(batch: list[Problem], table: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels; labels are -100 on the prompt (answer-only loss)."""
    seqs, labels = [], []
    for p in batch:
        task = TASKS[p.task]
        prompt = [chartok.BOS_ID] + chartok.encode(task.format_prompt(p.prompt), table)
        answer = chartok.encode(task.solve(p.spec), table) + [chartok.EOS_ID]
        seqs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    n = max(map(len, seqs))
    ids = torch.full((len(seqs), n), chartok.PAD_ID, dtype=torch.long)
    lab = torch.full((len(seqs), n), -100, dtype=torch.long)
    for i, (s, lab_i) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(lab_i)] = torch.tensor(lab_i)
    return ids, lab


def config_for(spec: ModelSpec, recipe: Recipe) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(chartok.vocab()), hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        head_dim=spec.hidden // spec.heads, max_position_embeddings=recipe.max_positions,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=chartok.BOS_ID, eos_token_id=chartok.EOS_ID, pad_token_id=chartok.PAD_ID,
        torch_dtype="float32",
    )


def train_one(name: str, spec: ModelSpec, recipe: Recipe, out: Path) -> dict:
    """Train one model into ``out`` (HF format + tokenizer); returns stats."""
    torch.manual_seed(spec.seed)
    rng = random.Random(spec.seed)
    model = LlamaForCausalLM(config_for(spec, recipe))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step: int) -> float:  # linear warm-up then cosine to 10%
        if step < spec.warmup:
            return spec.lr * (step + 1) / spec.warmup
        t = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
        return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))

    table, stream = chartok.vocab(), problems(rng, recipe.tasks, held_out=False)
    t0, loss_ewma = time.perf_counter(), None
    bar = tqdm(range(spec.steps), desc=f"train {name} ({params / 1e6:.2f}M)", unit="step", file=sys.stderr)
    model.train()
    for step in bar:
        ids, labels = make_batch([next(stream) for _ in range(spec.batch)], table)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        # bf16 autocast: ~2x faster matmuls where the CPU has bf16 instructions (master
        # weights stay fp32); without them (AVX2-only, e.g. some AMD EPYC hosts) torch
        # falls back to a scalar bf16 GEMM ~15x slower than fp32, so train in fp32 there.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16_FAST):
            loss = model(input_ids=ids, attention_mask=(ids != chartok.PAD_ID).long(), labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ewma = loss.item() if loss_ewma is None else 0.95 * loss_ewma + 0.05 * loss.item()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss_ewma:.3f}")
    train_s = time.perf_counter() - t0
    model.eval()
    model.generation_config.eos_token_id = chartok.EOS_ID
    model.generation_config.bos_token_id = chartok.BOS_ID
    model.generation_config.pad_token_id = chartok.PAD_ID
    model.save_pretrained(str(out))
    chartok.save(out)
    return {"params": params, "train_s": round(train_s, 1), "final_loss": round(loss_ewma or 0.0, 4), "steps": spec.steps}


@torch.no_grad()
def accuracy(model_dir: Path, recipe: Recipe, n: int | None = None, temperature: float = 0.0, seed: int = 1234) -> dict:
    """Single-sample accuracy on held-out problems, per task and overall."""
    tok = chartok.build_tokenizer()
    tok.padding_side = "left"
    model = LlamaForCausalLM.from_pretrained(str(model_dir)).eval()
    rng = random.Random(seed)
    stream = problems(rng, recipe.tasks, held_out=True)
    probs = [next(stream) for _ in range(n or recipe.eval_problems)]
    torch.manual_seed(seed)
    correct: dict[str, list[int]] = {t: [] for t in recipe.tasks}
    for i in range(0, len(probs), 100):
        chunk = probs[i : i + 100]
        enc = tok([TASKS[p.task].format_prompt(p.prompt) for p in chunk], return_tensors="pt", padding=True)
        gen = dict(do_sample=True, temperature=temperature, top_k=0) if temperature > 0 else dict(do_sample=False)
        out = model.generate(**enc, max_new_tokens=recipe.max_positions - enc["input_ids"].shape[1], **gen)
        for p, row in zip(chunk, out[:, enc["input_ids"].shape[1] :]):
            task = TASKS[p.task]
            text = tok.decode(row, skip_special_tokens=True)
            correct[p.task].append(int(task.grade(p.spec, task.parse_answer(text))))
    per_task = {t: round(sum(c) / max(1, len(c)), 3) for t, c in correct.items()}
    total = [x for c in correct.values() for x in c]
    return {"overall": round(sum(total) / len(total), 3), **per_task, "n": len(total), "temperature": temperature}


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
        for name in ("draft", "target"):
            report[name] = train_one(name, getattr(recipe, name), recipe, tmp / name)
        report["build_s"] = round(time.perf_counter() - t0, 1)
        for name in ("draft", "target"):
            report[name]["accuracy"] = accuracy(tmp / name, recipe)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
