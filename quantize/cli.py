"""quantize: export a Hugging Face causal LM to ONNX and quantize it to INT8 for the edge.

Usage::

    python -m coinfer.quantize import FILE.gguf OUT_DIR [--chat-template F]  # GGUF -> Hugging Face directory (float32)
    python -m coinfer.quantize export MODEL_DIR OUT_DIR [--dtype fp16]     # ONNX with KV cache + parity vs torch
    python -m coinfer.quantize int8 ONNX_DIR OUT_DIR [--scheme weight-only|dynamic|static] [--keep-float auto]
    python -m coinfer.quantize check DIR [--providers CUDAExecutionProvider] [--reference FP32_DIR]
    python -m coinfer.quantize bench FP32_DIR INT8_DIR... [--batch 5] [--rounds 5]
    (every command takes --json for machine output and --quiet to hide progress bars)

``int8`` runs the structure check and the accuracy gates against its source
before publishing the artefact; ``check`` runs them (and the provider placement
check) on any directory.

Exit status: 0 ok, 1 a check or gate failed (the message says which and by how
much), 2 bad input (missing / wrong model directory, unsupported architecture,
corrupt ONNX, bad calibration file, existing output directory). Nothing
half-written is left: outputs are built in a temp dir and renamed at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING

from coinfer.quantize.artifact import MODEL_FILE, ArtifactError, load_checked, model_file
from coinfer.quantize.gates import GateConfig
from coinfer.quantize.gguf_import import GGUF_ARCHITECTURES
from coinfer.quantize.int8 import SCHEMES, QuantConfig
from coinfer.quantize.prompts import PromptFileError

if TYPE_CHECKING:
    from coinfer.chat import ChatFormat


def _out(args: argparse.Namespace, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text)


def _gate_config(args: argparse.Namespace) -> GateConfig:
    return GateConfig(**{f.name: getattr(args, f.name) for f in fields(GateConfig)})


def cmd_import(args: argparse.Namespace) -> int:
    from coinfer.quantize.gguf_import import import_gguf, read_chat_template

    template = read_chat_template(args.chat_template) if args.chat_template else None
    report = import_gguf(args.gguf, args.out, chat_template=template)
    types = ", ".join(f"{n} {k}" for k, n in report["source"]["tensor_types"].items())
    _out(
        args,
        report,
        f"imported {args.gguf.name} ({report['source']['architecture']}, {report['parameters'] / 1e6:.0f}M "
        f"parameters from {types}; float32) to {args.out} in {report['seconds']['total']:.0f} s; chat template "
        f"{report['chat_template'] or 'none (plain prompts only)'}, end of turn {report['end_of_turn']!r}, "
        f"eos ids {report['eos_token_id']}",
    )
    return 0


def _add_chat_template(out: Path, template: str) -> None:
    """``template`` as the exported model's chat template (``chat_template.jinja``, which wins over
    ``tokenizer_config.json``'s in transformers and in ``coinfer.chat.ChatFormat``), listed in its manifest (the
    export's own records kept). The stop tokens stay the source's ``config.json``'s: a template that ends its
    turns with another token is better given to ``import``, which reads the end of turn off it."""
    from coinfer.manifest import MANIFEST, write_manifest

    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    manifest = json.loads((out / MANIFEST).read_text())
    write_manifest(out, {k: v for k, v in manifest.items() if k not in ("format", "version", "files")})


def cmd_export(args: argparse.Namespace) -> int:
    from coinfer.quantize.export import export_dir

    template = None
    if args.chat_template:
        from coinfer.quantize.gguf_import import read_chat_template

        template = read_chat_template(args.chat_template)
    prompt = None
    if args.parity_steps:
        from tokenizers import Tokenizer

        from coinfer.chat import ChatFormat
        from coinfer.quantize.prompts import TaskPrompt

        tok_file = args.model / "tokenizer.json"
        prompt = (
            TaskPrompt("If x=3 and y=5, compute (x+y)^2-x*y.").ids(
                Tokenizer.from_file(str(tok_file)),
                _with_template(args.model, template) if template else ChatFormat.from_dir(args.model),
            )
            if tok_file.exists()
            else [1, 2, 3, 4]
        )
    from coinfer.quantize.export import ParityFailed

    try:
        report = export_dir(
            args.model,
            args.out,
            parity_prompt=prompt,
            parity_steps=args.parity_steps,
            dtype=args.dtype,
            keep_failed=args.keep_failed,
            all_logits=args.all_logits,
            external_data={"auto": None, "always": True, "never": False}[args.external_data],
            kv_cache=args.kv_cache,
        )
    except ParityFailed as exc:
        report = exc.report
    published = not report["failures"] or args.keep_failed
    if template and published:
        _add_chat_template(args.out, template)
        report["chat_template"] = str(args.chat_template)
    parity = report.get("parity", {})
    _out(
        args,
        report,
        (f"exported {args.out / MODEL_FILE} ({args.dtype})" if published else f"NOT published: {report['failures'][0]}")
        + (
            f"; parity over {parity['decode_steps']} decode steps: max logit diff {parity['max_logit_diff']:.2e}, "
            f"greedy match {parity['greedy_match']}"
            if parity
            else ""
        ),
    )
    return 0 if not report["failures"] else 1


def _with_template(model_dir: Path, template: str) -> ChatFormat:
    """The chat format of ``template`` with the model directory's BOS and EOS tokens."""
    from coinfer.chat import ChatFormat

    fmt = ChatFormat.from_dir(model_dir)
    return ChatFormat(template=template, bos_token=fmt.bos_token, eos_token=fmt.eos_token)


def cmd_int8(args: argparse.Namespace) -> int:
    from coinfer.quantize.build import BuildOptions, CheckFailed, int8_dir

    cfg = QuantConfig(
        scheme=args.scheme,
        calib_prompts=args.calib_prompts,
        calib_decode_steps=args.calib_decode_steps,
        block_size=args.block_size,
        reduce_range=args.reduce_range,
        accuracy_level=args.accuracy_level,
        keep_float=tuple(args.keep_float),
    )
    opts = BuildOptions(
        gates=None if args.no_gates else _gate_config(args),
        calibration_file=args.calibration,
        gate_prompts=args.prompts_file,
        keep_failed=args.keep_failed,
        progress=not (args.quiet or args.json),
    )
    try:
        report = int8_dir(args.onnx_dir, args.out, cfg, opts)
    except CheckFailed as exc:
        report = exc.report
    failures = report["failures"]
    lines = [
        f"{args.scheme} INT8 model: {report['bytes'] / 1e6:.2f} MB ({report['bytes'] / report['source_bytes']:.2f}x "
        f"of the source), {report['structure']['weights_checked']} per-channel weights"
    ]
    lines += [f"  {g['message']}" for g in (report.get("gates") or {}).get("gates", [])]
    lines.append(f"published {args.out}" if not failures or args.keep_failed else "NOT published: " + failures[0])
    _out(args, report, "\n".join(lines))
    return 0 if not failures else 1


def cmd_check(args: argparse.Namespace) -> int:
    from coinfer.quantize.check import check_structure

    path = model_file(args.dir)
    load_checked(path)
    report: dict = {}
    failures: list[str] = []
    lines = []
    if not args.no_structure:
        checked, problems = check_structure(path)
        report["structure"] = {"weights_checked": checked, "problems": problems}
        failures += [f"structure: {p}" for p in problems]
        lines.append(
            f"structure: {checked} quantized weights, "
            + ("ok" if not problems else f"{len(problems)} problem(s):\n  " + "\n  ".join(problems))
        )
    if args.providers:
        from coinfer.quantize.placement import check_placement

        pl = check_placement(path, args.providers)
        report["placement"] = asdict(pl)
        failures += [f"placement: {p}" for p in pl.problems]
        lines.append(
            f"placement ({', '.join(pl.session)}): "
            + ", ".join(f"{k} {v} nodes" for k, v in pl.nodes.items())
            + ("" if pl.ok else "\n  " + "\n  ".join(pl.problems))
        )
    if args.reference:
        from coinfer.quantize.gates import gate_dirs, gate_report

        cfg = _gate_config(args)
        results = gate_dirs(
            args.reference,
            path.parent,
            cfg,
            progress=not (args.quiet or args.json),
            allow_unverified=args.allow_unverified,
            prompts_file=args.prompts_file,
        )
        report["gates"] = gate_report(results, cfg)
        failures += [r.message for r in results if not r.passed]
        lines += [r.message for r in results]
    report["failures"] = failures
    _out(args, report, "\n".join(lines) or "nothing to check (see --help)")
    return 0 if not failures else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from coinfer.quantize import bench

    cfg = bench.BenchConfig(
        batch=args.batch,
        prompt_tokens=args.prompt_tokens,
        decode_steps=args.decode_steps,
        threads=args.threads,
        providers=tuple(args.providers),
        rounds=args.rounds,
    )
    result = bench.run(args.dirs, cfg, progress=not (args.quiet or args.json))
    _out(args, result, bench.table(result))
    return 0


def _gate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompts-file",
        type=Path,
        help='gates: JSONL file of {"prompt": ...} chat requests (a "task" makes a line gradable) '
        "instead of the shipped generic prompts (or the tasks the model declares); "
        "int8 static without --calibration calibrates on its even lines and gates on its odd ones",
    )
    d = GateConfig()
    g = p.add_argument_group("accuracy gates (against the FP32 reference, on held-out prompts)")
    g.add_argument(
        "--min-top1-agreement",
        type=float,
        default=d.min_top1_agreement,
        help="min fraction of KV-path positions (teacher-forced on FP32's greedy continuations) whose "
        "argmax matches FP32",
    )
    g.add_argument(
        "--max-nll-delta",
        type=float,
        default=d.max_nll_delta,
        help="most the reference continuations' NLL may rise under the candidate (nats/token; "
        "perplexity ratio = e^delta)",
    )
    g.add_argument(
        "--max-kl-divergence",
        type=float,
        default=d.max_kl_divergence,
        help="most mean KL(FP32 || candidate) of the next-token distributions (nats/position)",
    )
    g.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=d.max_accuracy_drop,
        help="max drop in task accuracy of sampled drafts (absolute fraction; prompts of a declared task)",
    )
    g.add_argument("--prompts", type=int, default=d.prompts, help="most prompts gated")
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=d.max_new_tokens,
        help="length of FP32's greedy continuation the measures run over, per prompt",
    )
    g.add_argument("--drafts", type=int, default=d.drafts, help="sampled drafts per prompt (accuracy drop)")
    g.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature of those drafts")
    g.add_argument("--seed", type=int, default=d.seed, help="sampling seed of those drafts")


def _import_command(sub) -> None:
    p = sub.add_parser(
        "import",
        help="GGUF file -> Hugging Face directory (float32 safetensors, tokenizer, chat "
        "template), ready for export and for vLLM",
    )
    p.add_argument("gguf", type=Path, help=f"GGUF file (architectures: {', '.join(GGUF_ARCHITECTURES)})")
    p.add_argument("out", type=Path, help="output directory (must not exist)")
    _chat_template_arg(p, "the imported model's (saved with its tokenizer: the edge's export and vLLM read it)")
    p.set_defaults(func=cmd_import)


def _chat_template_arg(p: argparse.ArgumentParser, whose: str) -> None:
    p.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help=f"Jinja chat template (as vLLM's --chat-template) to use as {whose}; it replaces the model's own. "
        "A model without one serves plain prompts only: requests in chat form are refused",
    )


def _export_command(sub) -> None:
    p = sub.add_parser("export", help="HF causal LM dir -> ONNX with KV cache (FP32 or FP16)")
    p.add_argument("model", type=Path, help="Hugging Face model directory (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2)")
    p.add_argument("out", type=Path, help="output directory (must not exist)")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32", help="precision of weights, cache and logits")
    p.add_argument("--parity-steps", type=int, default=16, help="decode steps compared with torch (0 = skip)")
    p.add_argument(
        "--keep-failed",
        action="store_true",
        help="publish even if parity fails (the manifest records it; the edge refuses such a model)",
    )
    p.add_argument(
        "--all-logits",
        action="store_true",
        help="logits for every position (default: the last only, all the edge samples from)",
    )
    p.add_argument(
        "--kv-cache",
        choices=("concat", "buffer"),
        default="concat",
        help="concat: Optimum's graph (the cache grows by concatenation each step), every execution "
        "provider runs it; buffer: ONNX Runtime's fused graph, fastest on CPU (GroupQueryAttention over "
        "a cache the edge preallocates and writes in place, fused q/k/v and gate/up MatMuls, one node "
        "per rotation and per residual RMSNorm; same input/output names)",
    )
    p.add_argument(
        "--external-data",
        choices=("auto", "always", "never"),
        default="auto",
        help="weights in model.onnx.data beside the graph (auto: above 1 GiB; a protobuf file holds 2 GiB "
        "at most); int8 keeps its source's layout",
    )
    _chat_template_arg(p, "the exported model's (the edge renders conversations with it)")
    p.set_defaults(func=cmd_export)


def _int8_command(sub) -> None:
    q = QuantConfig()
    p = sub.add_parser("int8", help="exported ONNX dir -> checked INT8 per-channel artefact")
    p.add_argument("onnx_dir", type=Path, help="directory with model.onnx (from `export`)")
    p.add_argument("out", type=Path, help="output directory (must not exist)")
    p.add_argument(
        "--scheme",
        choices=SCHEMES,
        default=q.scheme,
        help="weight-only (default): 8-bit MatMulNBits, int8 activations per token and K-block on CPU "
        "(keeps a real model's answers); dynamic: int8 weights, per-tensor dynamic activations (CPU); "
        "static: QDQ calibrated on task prompts (TensorRT / CPU)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        help='static: JSONL file of {"prompt": ..., "task": optional} lines (default: the shipped generic '
        "prompts, or the tasks the model declares in config.json coinfer_tasks)",
    )
    p.add_argument("--calib-prompts", type=int, default=q.calib_prompts, help="static: most calibration prompts")
    p.add_argument(
        "--calib-decode-steps",
        type=int,
        default=q.calib_decode_steps,
        help="static: decode steps recorded per calibration prompt",
    )
    _int8_weight_args(p, q)
    p.add_argument("--no-gates", action="store_true", help="skip the accuracy gates (structure is always checked)")
    p.add_argument(
        "--keep-failed",
        action="store_true",
        help="publish even if a check fails (the manifest records it; the edge refuses such a model)",
    )
    _gate_args(p)
    p.set_defaults(func=cmd_int8)


def _int8_weight_args(p, q: QuantConfig) -> None:
    """``int8``'s options of which weights are quantized, and how."""
    p.add_argument(
        "--block-size",
        type=int,
        default=q.block_size,
        help="weight-only: K-block (power of 2 >= 16; 0 = one block over K)",
    )
    p.add_argument(
        "--accuracy-level",
        type=int,
        choices=(0, 1, 2, 3, 4),
        default=q.accuracy_level,
        help="weight-only: MatMulNBits compute type on CPU (4 = int8 activations per block, fast; "
        "0/1 = float, exact but slow)",
    )
    p.add_argument(
        "--keep-float",
        nargs="+",
        default=list(q.keep_float),
        metavar="NAME",
        help="leave MatMuls whose weight name contains NAME in float (e.g. down_proj)",
    )
    p.add_argument(
        "--reduce-range",
        choices=("auto", "on", "off"),
        default=q.reduce_range,
        help="dynamic/static: 7-bit weights (auto: on where the CPU lacks VNNI, whose u8s8 kernels saturate)",
    )


def _check_command(sub) -> None:
    p = sub.add_parser("check", help="structure, provider placement and accuracy gates of a model")
    p.add_argument("dir", type=Path, help="model directory or .onnx file")
    p.add_argument("--no-structure", action="store_true", help="skip the per-channel structure check")
    p.add_argument(
        "--providers", nargs="+", metavar="EP", help="placement check: e.g. CUDAExecutionProvider CPUExecutionProvider"
    )
    p.add_argument("--reference", type=Path, help="FP32 model directory: run the accuracy gates against it")
    p.add_argument("--allow-unverified", action="store_true", help="gate a model without (or failing) its manifest")
    _gate_args(p)
    p.set_defaults(func=cmd_check)


def _bench_command(sub) -> None:
    p = sub.add_parser("bench", help="cold start, ms/token at batch 1 and N, RSS, size; first dir = baseline")
    p.add_argument("dirs", type=Path, nargs="+", help="model directories (FP32 first)")
    p.add_argument("--batch", type=int, default=5, help="second batch size measured (the edge drafts 5 at once)")
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt length prefilled before decoding")
    p.add_argument("--decode-steps", type=int, default=32, help="decode steps timed per run")
    p.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0 = all cores)")
    p.add_argument(
        "--providers",
        nargs="+",
        default=["CPUExecutionProvider"],
        metavar="EP",
        help="ONNX Runtime execution providers, in order of preference",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure the models in turn this many times and report medians (a noisy machine's "
        "drift then falls on every model alike)",
    )
    p.set_defaults(func=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m coinfer.quantize",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = ap.add_subparsers(dest="command", required=True)
    _import_command(sub)
    _export_command(sub)
    _int8_command(sub)
    _check_command(sub)
    _bench_command(sub)
    for sp in sub.choices.values():
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from coinfer.manifest import ManifestError

    try:
        return args.func(args)
    except (ArtifactError, PromptFileError, ManifestError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
