"""Per-step sampling cost at a real vocabulary: the edge's ``sample_next`` vs the dense float64
full-sort sampler it replaced.

Usage::

    .venv/bin/python -m benchmarks.sampling_speed [--vocab 128256] [--rows 5] [--steps 200]

Logits are drawn so that a row looks like a trained model's (a few dozen plausible tokens, a
long tail); T=0.3, top_p 0.95, presence/frequency penalties 0.2/0.1 over a 200-token history
per row. Prints ms per step of each and their ratio, measured in one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _old_sample(logits: np.ndarray, counts: np.ndarray, s, rngs) -> np.ndarray:
    """The previous sampler: float64, dense [N, V] counts, full argsort for top-p."""
    from coinfer.edge.sampling import apply_penalties, top_p_filter

    logits = logits.astype(np.float64)
    adj = apply_penalties(logits, counts, s.presence_penalty, s.frequency_penalty)
    z = adj / s.temperature
    z = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(z)
    probs /= probs.sum(axis=-1, keepdims=True)
    probs = top_p_filter(probs, s.top_p)
    u = np.array([rng.random() for rng in rngs])[:, None]
    cdf = np.cumsum(probs, axis=-1)
    return np.minimum((cdf < u * cdf[:, -1:]).sum(axis=-1), probs.shape[1] - 1)


def run(vocab: int, rows: int, steps: int) -> dict:
    from coinfer.edge.sampling import Sampling, sample_next

    rng = np.random.default_rng(0)
    s = Sampling(n=rows, temperature=0.3, top_p=0.95, presence_penalty=0.2, frequency_penalty=0.1)
    history = [rng.integers(0, vocab, 200).tolist() for _ in range(rows)]
    counts = np.zeros((rows, vocab))
    for r, ids in enumerate(history):
        np.add.at(counts[r], ids, 1)
    base = rng.normal(size=(rows, vocab)).astype(np.float32)
    base[:, rng.integers(0, vocab, 40)] += 6.0  # a few dozen likely tokens over a long tail
    out = {"vocab": vocab, "rows": rows, "steps": steps}
    for name, fn in (
        ("new", lambda lg, g: sample_next(lg, history, s, g)),
        ("old", lambda lg, g: _old_sample(lg, counts, s, g)),
    ):
        gens = [np.random.default_rng(i) for i in range(rows)]
        fn(base, gens)  # warm-up
        t0 = time.perf_counter()
        for _ in range(steps):
            fn(base, gens)
        out[f"{name}_ms_per_step"] = round((time.perf_counter() - t0) / steps * 1e3, 3)
    out["speedup"] = round(out["old_ms_per_step"] / out["new_ms_per_step"], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.vocab, args.rows, args.steps), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
