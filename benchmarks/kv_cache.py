"""Decode step cost of the two KV-cache layouts as the context grows: ``concat`` (Optimum's graph: each
step concatenates the new keys and values onto the whole cache, a fresh tensor) and ``buffer``
(GroupQueryAttention writing into a preallocated buffer bound as input and output).

    .venv/bin/python -m benchmarks.kv_cache [--contexts 64 512 2048] [--batch 5] [--steps 16] [--json]

A random Llama (hidden 512, 8 layers, 8 heads / 2 KV heads, vocab 32000; the values do not matter for
speed) is exported both ways into a temp dir; ms per decode step at batch ``--batch`` after a
prompt of each context length, median over ``--steps``, measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def build(root: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    LlamaForCausalLM(cfg).save_pretrained(str(root / "hf"))
    return root / "hf"


def step_ms(model: Path, context: int, batch: int, steps: int) -> float:
    from coinfer.edge.onnx_lm import OnnxLM

    lm = OnnxLM(model, providers=["CPUExecutionProvider"])
    prompt = np.array([[4 + i % 500 for i in range(context)]], np.int64)
    logits, past = lm.step(prompt, lm.empty_past(context + steps + 2))
    past = lm.tile(past, batch)
    ids = np.repeat(logits.argmax(-1)[:, None], batch, 0).astype(np.int64)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        logits, past = lm.step(ids, past)
        times.append((time.perf_counter() - t0) * 1e3)
        ids = logits.argmax(-1)[:, None].astype(np.int64)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 2048])
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from coinfer.quantize.export import export_dir

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf = build(root)
        for layout in ("concat", "buffer"):
            export_dir(hf, root / layout, kv_cache=layout)
        rows = []
        for ctx in args.contexts:
            row = {"context": ctx, "batch": args.batch}
            for layout in ("concat", "buffer"):
                row[f"{layout}_ms"] = round(step_ms(root / layout / "model.onnx", ctx, args.batch, args.steps), 2)
            row["concat_over_buffer"] = round(row["concat_ms"] / row["buffer_ms"], 2)
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'context':>8} {'concat ms/step':>15} {'buffer ms/step':>15} {'concat/buffer':>14}")
        for r in rows:
            print(f"{r['context']:>8} {r['concat_ms']:>15} {r['buffer_ms']:>15} {r['concat_over_buffer']:>14}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
