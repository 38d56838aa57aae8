"""Accuracy gates of a quantized model against its FP32 reference, on held-out prompts (``coinfer.quantize.prompts``).

The reference greedily continues each prompt; the candidate is fed the same tokens one by one on its
own KV path (teacher forcing), and at every position the two next-token distributions are compared.
Teacher forcing keeps every position comparable however early the candidate would have diverged, so
each measure is a mean over ~1,000-2,000 positions rather than a verdict per prompt.

Gates (pass/fail):

1. ``top1_agreement``: share of positions where the candidate's argmax is the reference's.
2. ``nll_delta``: rise of the mean NLL (nats/token) of the reference's continuations under the
   candidate; ``exp(delta)`` is the perplexity ratio, given in the detail.
3. ``kl_divergence``: mean KL(reference || candidate) of the next-token distributions (nats), the
   whole distribution rather than its top token: it sees what sampling (the edge drafts at T > 0)
   meets before any argmax flips.
4. ``accuracy_drop`` (only on prompts of a task the model declares): task accuracy of sampled drafts
   (the edge's real workload, ``drafts`` per prompt, same seeds for both models) of the reference
   minus the candidate's. Negative = the candidate did better.

Reported, not gated: ``greedy_match``, the share of prompts whose whole greedy continuation is
identical (every position agrees). It follows top1^length (0.944^64 ~ 0.03): one flipped token
anywhere fails the prompt, so it measures chaos, not quality; as a gate it refused a sound real
model (SmolLM2-135M-Instruct weight-only INT8: top-1 0.944, NLL delta +0.014, greedy match 3/32).

The thresholds and the measurements behind them are on ``GateConfig``'s fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from coinfer.edge.draft_engine import OrtDraftEngine
from coinfer.edge.sampling import Sampling
from coinfer.quantize.prompts import TaskPrompt
from coinfer.tasks import TASKS

TASK_FREE = ("top1_agreement", "nll_delta", "kl_divergence")
"""The gates that judge any model on any prompts (no task grammar needed)."""
_AT_MOST = ("nll_delta", "kl_divergence", "accuracy_drop")  # the other gates are "at least"


@dataclass(frozen=True)
class GateConfig:
    min_top1_agreement: float = 0.90
    """Share of positions whose argmax matches FP32: a flipped argmax is a token the float model would
    not have written there. Sound INT8 measured 0.94-0.99 (demo draft static 0.98-0.99 over two
    trainings, 7-bit weights alike; SmolLM2 weight-only 0.944); a real model with per-tensor activation
    scales 0.50 (SmolLM2 static) to 0.85 (dynamic). Random-weight test models flip near-ties down to
    0.91, hence not higher."""
    max_nll_delta: float = 0.10
    """Most the mean NLL of the reference's continuations may rise under the candidate (nats/token): a
    perplexity ratio of at most e^0.10 = 1.105 on text the reference finds likely. 50x the demo draft's
    static INT8 (0.001-0.002) and 7x SmolLM2 weight-only (0.014); under SmolLM2 dynamic (0.167: per-tensor
    activation scales clip its outlier channels) and far under a destroyed model (1.61)."""
    max_kl_divergence: float = 0.05
    """Most mean KL(FP32 || candidate) per position (nats). By Pinsker, KL <= 0.05 bounds the total
    variation to sqrt(0.05 / 2) = 0.16: a token sampled from the candidate is one the FP32 model's
    speculative check (acceptance sum(min(p, q)) = 1 - TV) accepts with probability >= 0.84 even in the
    worst case. Measured: demo draft static 0.001-0.002 (on its gate prompts); random-weight test families
    (static, 7-bit weights) at most 0.013; SmolLM2 on English text: weight-only 0.015, dynamic 0.030,
    static 1.49."""
    max_accuracy_drop: float = 0.10
    """Absolute drop in the fraction of correct sampled drafts."""
    prompts: int = 32
    max_new_tokens: int = 64
    drafts: int = 4
    temperature: float = 0.7
    seed: int = 0

    def validate(self) -> None:
        if not 0.0 <= self.min_top1_agreement <= 1.0:
            raise ValueError(f"min_top1_agreement: must be in [0, 1], got {self.min_top1_agreement}")
        for name in ("max_nll_delta", "max_kl_divergence"):
            if not 0.0 <= getattr(self, name) <= 10.0:
                raise ValueError(f"{name}: must be in [0, 10], got {getattr(self, name)}")
        if not -1.0 <= self.max_accuracy_drop <= 1.0:
            raise ValueError(f"max_accuracy_drop: must be in [-1, 1], got {self.max_accuracy_drop}")
        if not 1 <= self.prompts <= 10000 or not 1 <= self.max_new_tokens <= 4096 or not 1 <= self.drafts <= 64:
            raise ValueError("prompts / max_new_tokens / drafts: out of range (1..10000 / 1..4096 / 1..64)")
        if not 0.0 < self.temperature <= 2.0:
            raise ValueError(f"temperature: must be in (0, 2], got {self.temperature}")


@dataclass
class GateResult:
    name: str
    value: float | None
    threshold: float | None
    """None: reported for information, never failed."""
    passed: bool
    detail: str

    @property
    def message(self) -> str:
        if self.value is None:
            return f"{self.name}: not applicable ({self.detail})"
        if self.threshold is None:
            return f"{self.name} {self.value:.3f} (reported, not gated); {self.detail}"
        op = "<=" if self.name in _AT_MOST else ">="
        verdict = "pass" if self.passed else f"FAIL by {abs(self.value - self.threshold):.3f}"
        return f"{self.name} {self.value:.3f} (needs {op} {self.threshold:.3f}): {verdict}; {self.detail}"


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis in float64 (float32 sums over a 50k-150k vocabulary lose the
    small differences these gates measure)."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass
class Tally:
    """Sums over teacher-forced positions: ``add`` one prompt at a time, ``results`` gives the means."""

    positions: int = 0
    agree: int = 0
    nll_ref: float = 0.0
    nll_cand: float = 0.0
    kl: float = 0.0
    prompts: int = 0
    identical: int = 0
    """Prompts whose every position agrees: exactly those whose greedy continuations are identical
    (fed its own argmax, the candidate is fed the reference's tokens), with no second decode."""

    def add(self, ref_logits: Sequence[np.ndarray], cand_logits: Sequence[np.ndarray], tokens: Sequence[int]) -> None:
        """One prompt: both models' logits [V] before each of ``tokens`` (the reference's continuation)."""
        same = 0
        for r, c, tok in zip(ref_logits, cand_logits, tokens):
            lp, lq = log_softmax(r), log_softmax(c)
            same += int(np.argmax(r) == np.argmax(c))
            self.nll_ref -= float(lp[tok])
            self.nll_cand -= float(lq[tok])
            self.kl += float(np.exp(lp) @ (lp - lq))  # KL(p || q) = sum_v p_v (log p_v - log q_v)
        self.positions += len(tokens)
        self.agree += same
        self.prompts += 1
        self.identical += same == len(tokens)

    def results(self, cfg: GateConfig) -> list[GateResult]:
        """The task-free gates, then greedy match (reported only)."""
        n = self.positions
        if not n:
            return [
                GateResult(name, None, None, True, "no positions: the reference ended every prompt at once")
                for name in TASK_FREE
            ]
        top1, delta, kl = self.agree / n, (self.nll_cand - self.nll_ref) / n, self.kl / n
        where = f"{n} positions over {self.prompts} prompts"
        return [
            GateResult(
                "top1_agreement", top1, cfg.min_top1_agreement, top1 >= cfg.min_top1_agreement, f"{self.agree}/{where}"
            ),
            GateResult(
                "nll_delta",
                delta,
                cfg.max_nll_delta,
                delta <= cfg.max_nll_delta,
                f"reference continuations: {self.nll_ref / n:.3f} nats/token under the reference, "
                f"{self.nll_cand / n:.3f} under the candidate, perplexity x{math.exp(min(delta, 50.0)):.3f} "
                f"({where})",
            ),
            GateResult(
                "kl_divergence",
                kl,
                cfg.max_kl_divergence,
                kl <= cfg.max_kl_divergence,
                f"mean KL(FP32 || candidate) of the next-token distributions, nats ({where})",
            ),
            GateResult(
                "greedy_match",
                self.identical / self.prompts,
                None,
                True,
                f"{self.identical}/{self.prompts} greedy continuations identical (follows top1^length: one "
                "flipped token changes the rest)",
            ),
        ]


def _correct(engine: OrtDraftEngine, p: TaskPrompt, s: Sampling) -> int:
    """How many of the drafts ``engine`` samples for ``p`` the task grades right."""
    task = TASKS[p.problem.task]
    return sum(
        task.grade(p.problem.spec, task.parse_answer(d.text)) for d in engine.generate(p.model_text(engine.chat), s)
    )


def run_gates(
    reference: OrtDraftEngine,
    candidate: OrtDraftEngine,
    prompts: Sequence[TaskPrompt],
    cfg: GateConfig = GateConfig(),
    on_prompt: Callable[[], None] | None = None,
) -> list[GateResult]:
    cfg.validate()
    tally = Tally()
    ref_ok = cand_ok = graded = 0
    for i, p in enumerate(prompts):
        ids = p.ids(reference.tokenizer, reference.chat)
        ref_tokens, ref_logits = reference.lm.greedy(ids, cfg.max_new_tokens, reference.eos_ids)
        tally.add(ref_logits, candidate.lm.forced(ids, ref_tokens), ref_tokens)
        if p.problem is not None:
            s = Sampling(
                n=cfg.drafts,
                temperature=cfg.temperature,
                top_p=1.0,
                presence_penalty=0.0,
                frequency_penalty=0.0,
                max_new_tokens=cfg.max_new_tokens,
                seed=cfg.seed + 1000 * i,
            )
            ref_ok += _correct(reference, p, s)
            cand_ok += _correct(candidate, p, s)
            graded += cfg.drafts
        if on_prompt is not None:
            on_prompt()
    return [*tally.results(cfg), accuracy_gate(ref_ok, cand_ok, graded, cfg)]


def accuracy_gate(ref_ok: int, cand_ok: int, graded: int, cfg: GateConfig) -> GateResult:
    """The accuracy-drop gate from graded draft counts. It judges only a reference that gets some
    drafts right: a model that never learnt the task scores 0 before and after, and "no drop"
    would be a pass the gate did not earn -- it says "not applicable" instead."""
    if graded and ref_ok:
        drop = (ref_ok - cand_ok) / graded
        return GateResult(
            "accuracy_drop",
            drop,
            cfg.max_accuracy_drop,
            drop <= cfg.max_accuracy_drop,
            f"sampled drafts correct: reference {ref_ok}/{graded}, candidate {cand_ok}/{graded} "
            f"(T={cfg.temperature}, {cfg.drafts} per prompt)",
        )
    if graded:
        return GateResult(
            "accuracy_drop",
            None,
            cfg.max_accuracy_drop,
            True,
            f"the reference model answers none of {graded} sampled drafts right: this gate cannot "
            "judge it; give prompts of a task it knows (--prompts-file) or rely on the other gates",
        )
    return GateResult(
        "accuracy_drop",
        None,
        cfg.max_accuracy_drop,
        True,
        f"no gradable task prompts: the task-free gates ({', '.join(TASK_FREE)}) judge alone",
    )


def gate_report(results: list[GateResult], cfg: GateConfig) -> dict:
    return {
        "passed": all(r.passed for r in results),
        "config": asdict(cfg),
        "gates": [asdict(r) | {"message": r.message} for r in results],
    }


def gate_dirs(
    reference_dir: Path,
    candidate_dir: Path,
    cfg: GateConfig = GateConfig(),
    progress: bool = True,
    allow_unverified: bool = False,
    prompts_file: Path | None = None,
    prompts: Sequence[TaskPrompt] | None = None,
) -> list[GateResult]:
    """Run the gates of ``candidate_dir`` against ``reference_dir`` on CPU: on ``prompts``, the user's
    prompts (``prompts_file``, JSONL chat requests; graded only where a line names a task), or the
    held-out side of the model's declared tasks or of the shipped generic set."""
    from tqdm import tqdm

    from coinfer.quantize.prompts import default_prompts, read_prompt_file

    if prompts is None:
        prompts = (
            read_prompt_file(prompts_file)
            if prompts_file is not None
            else default_prompts(reference_dir, cfg.prompts, held_out=True, seed=2)
        )
    prompts = list(prompts)[: cfg.prompts]
    reference = OrtDraftEngine(reference_dir, providers=["CPUExecutionProvider"])
    candidate = OrtDraftEngine(candidate_dir, providers=["CPUExecutionProvider"], allow_unverified=allow_unverified)
    with tqdm(total=len(prompts), desc="gates", unit="prompt", disable=not progress) as bar:
        return run_gates(reference, candidate, prompts, cfg, on_prompt=bar.update)
