"""Perplexity of exported models on a fixed English text, each against the first (the FP32 export).

    .venv/bin/python -m benchmarks.perplexity FP32_DIR INT8_DIR... [--text FILE] [--tokens 1024] [--json]

The gates (``quantize int8``) judge a candidate on the reference's own continuations of chat
prompts; this reads text no model wrote: by default Python's own licence (``LICENSE.txt``, which
every CPython install carries) followed by the ``json`` module's documentation, the first
``--tokens`` tokens of it fed one at a time on the KV path, as the edge decodes. Per model:
perplexity, and against the first model the perplexity ratio, NLL delta (nats/token), top-1
agreement and KL(first || model) -- the gates' measures (``coinfer.quantize.gates.Tally``) on this text.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def default_text() -> str:
    licence = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "LICENSE.txt"
    return (licence.read_text(encoding="utf-8") if licence.is_file() else "") + "\n\n" + json.__doc__


def run(dirs: list[Path], text: str, tokens: int = 1024) -> list[dict]:
    from tokenizers import Tokenizer

    from coinfer.edge.onnx_lm import OnnxLM
    from coinfer.quantize.gates import GateConfig, Tally

    ids = Tokenizer.from_file(str(dirs[0] / "tokenizer.json")).encode(text).ids[:tokens]
    if len(ids) < 2:
        raise ValueError("text: fewer than 2 tokens")
    rows, ref = [], None
    for d in dirs:
        logits = OnnxLM(d / "model.onnx", providers=["CPUExecutionProvider"]).forced(ids[:1], ids[1:])
        if ref is None:
            ref = logits
        tally = Tally()
        tally.add(ref, logits, ids[1:])
        gates = {g.name: g.value for g in tally.results(GateConfig())}
        n = tally.positions
        rows.append(
            {
                "model": str(d),
                "tokens": n,
                "perplexity": math.exp(tally.nll_cand / n),
                "perplexity_ratio": math.exp(gates["nll_delta"]),
                "nll_delta": gates["nll_delta"],
                "top1_agreement": gates["top1_agreement"],
                "kl_divergence": gates["kl_divergence"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.perplexity", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", type=Path, nargs="+", help="exported model directories, the reference first")
    ap.add_argument("--text", type=Path, help="UTF-8 text file (default: Python's licence + the json module's doc)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of the text read (2..16384)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not 2 <= args.tokens <= 16384:
        ap.error(f"--tokens: must be in 2..16384, got {args.tokens}")
    rows = run(args.dirs, args.text.read_text(encoding="utf-8") if args.text else default_text(), args.tokens)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'model':>40}  {'tokens':>6}  {'ppl':>8}  {'ppl x':>6}  {'NLL delta':>9}  {'top-1':>6}  {'KL':>6}")
    for r in rows:
        print(
            f"{Path(r['model']).name[-40:]:>40}  {r['tokens']:>6}  {r['perplexity']:>8.3f}  {r['perplexity_ratio']:>6.3f}"
            f"  {r['nll_delta']:>+9.4f}  {r['top1_agreement']:>6.3f}  {r['kl_divergence']:>6.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
