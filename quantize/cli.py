"""quantize: export a Hugging Face causal LM to ONNX and quantize it to INT8 for the edge.

Usage::

    python -m quantize export MODEL_DIR OUT_DIR          # FP32 ONNX with KV cache + parity check
    python -m quantize int8 ONNX_DIR OUT_DIR --scheme dynamic
    python -m quantize check OUT_DIR                     # per-channel structure check
    (every command takes --json for machine output)

Exit status: 0 ok, 1 a check failed (the message says which and by how much),
2 bad input (missing / wrong model directory, existing output directory).
Nothing half-written is left: outputs are built in a temp dir and renamed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from quantize.export import MODEL_FILE, ExportError
from quantize.int8 import SCHEMES, quantize_dir


def _out(args: argparse.Namespace, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def cmd_export(args: argparse.Namespace) -> int:
    from quantize.export import export_dir

    prompt = None
    if args.parity_steps:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(args.model / "tokenizer.json")) if (args.model / "tokenizer.json").exists() else None
        prompt = tok.encode("If x=3 and y=5, compute (x+y)^2-x*y.\n").ids if tok else [1, 2, 3, 4]
    report = export_dir(args.model, args.out, parity_prompt=prompt, parity_steps=args.parity_steps)
    parity = report.get("parity", {})
    _out(args, report, f"exported {args.out / MODEL_FILE}" + (
        f"; parity over {parity['decode_steps']} decode steps: max logit diff {parity['max_logit_diff']:.2e}, "
        f"greedy match {parity['greedy_match']}" if parity else ""))
    return 0 if not parity or parity["greedy_match"] else 1


def cmd_int8(args: argparse.Namespace) -> int:
    report = quantize_dir(args.onnx_dir, args.out, scheme=args.scheme)
    problems = report["structure_problems"]
    _out(args, report, f"{args.scheme} INT8 model at {args.out / MODEL_FILE}: {report['bytes'] / 1e6:.2f} MB "
         f"({report['bytes'] / report['source_bytes']:.2f}x of FP32); structure "
         + ("ok" if not problems else f"FAILED: {problems[0]}"))
    return 0 if not problems else 1


def cmd_check(args: argparse.Namespace) -> int:
    from quantize.check import check_structure

    path = args.dir / MODEL_FILE if args.dir.is_dir() else args.dir
    if not path.is_file():
        raise ExportError(f"{path}: missing")
    checked, problems = check_structure(path)
    _out(args, {"weights_checked": checked, "problems": problems},
         f"structure: {checked} quantized weights, " + ("ok" if not problems else
                                                          f"{len(problems)} problem(s):\n  " + "\n  ".join(problems)))
    return 0 if not problems else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m quantize", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="HF causal LM dir -> FP32 ONNX with KV cache")
    p.add_argument("model", type=Path, help="Hugging Face model directory (LlamaForCausalLM)")
    p.add_argument("out", type=Path, help="output directory (must not exist)")
    p.add_argument("--parity-steps", type=int, default=16, help="decode steps compared with torch (0 = skip)")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("int8", help="exported ONNX dir -> INT8 per-channel model")
    p.add_argument("onnx_dir", type=Path, help="directory with model.onnx (from `export`)")
    p.add_argument("out", type=Path, help="output directory (must not exist)")
    p.add_argument("--scheme", choices=SCHEMES, default="dynamic",
                   help="dynamic: per-channel int8 weights, dynamic activations (CPU VNNI)")
    p.set_defaults(func=cmd_int8)
    p = sub.add_parser("check", help="structure check of an INT8 model")
    p.add_argument("dir", type=Path, help="model directory or .onnx file")
    p.set_defaults(func=cmd_check)
    for sp in sub.choices.values():
        sp.add_argument("--json", action="store_true", help="machine-readable output")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ExportError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
