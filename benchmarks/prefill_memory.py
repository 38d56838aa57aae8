"""Prefill memory at a real vocabulary: the LM head on the last position vs on every position.

Usage::

    .venv/bin/python -m benchmarks.prefill_memory [--vocab 128256] [--prompt 1024]

Builds a small random-weight Llama (hidden 64, 2 layers) with a 128k vocabulary, exports it
twice (``--all-logits`` and the default last-position logits), and runs one prefill of a
1,024-token prompt on ONNX Runtime (CPU) in a fresh process per export; prints each process's
peak RSS (VmHWM) and the prefill time, measured in one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import sys, time, json
import numpy as np
from coinfer.edge.onnx_lm import OnnxLM
lm = OnnxLM(sys.argv[1], providers=["CPUExecutionProvider"])
ids = np.random.default_rng(0).integers(5, int(sys.argv[3]), (1, int(sys.argv[2])), dtype=np.int64)
t0 = time.perf_counter()
logits, past = lm.step(ids, lm.empty_past())
ms = (time.perf_counter() - t0) * 1e3
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"prefill_ms": round(ms, 1), "peak_rss_mb": round(hwm / 1024, 1), "logits_shape": list(logits.shape)}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--prompt", type=int, default=1024)
    args = ap.parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from coinfer.quantize.export import export_dir

    report: dict = {"vocab": args.vocab, "prompt_tokens": args.prompt}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hf"
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=args.vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=max(2048, args.prompt + 16),
            tie_word_embeddings=False,
        )
        LlamaForCausalLM(cfg).save_pretrained(str(src))
        for name, all_logits in (("all_positions", True), ("last_position", False)):
            out = Path(tmp) / name
            t0 = time.perf_counter()
            export_dir(src, out, parity_prompt=[1, 10, 20, 30], parity_steps=2, all_logits=all_logits)
            r = subprocess.run(
                [sys.executable, "-c", _CHILD, str(out / "model.onnx"), str(args.prompt), str(args.vocab)],
                capture_output=True,
                text=True,
                check=True,
            )
            report[name] = json.loads(r.stdout.strip().splitlines()[-1]) | {
                "export_s": round(time.perf_counter() - t0, 1)
            }
    report["peak_rss_ratio"] = round(report["last_position"]["peak_rss_mb"] / report["all_positions"]["peak_rss_mb"], 3)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
