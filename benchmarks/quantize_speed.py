"""INT8 vs FP32 on ONNX Runtime: a >= 100M-parameter Llama (random weights) and the demo draft.

    .venv/bin/python -m benchmarks.quantize_speed [--json] [--skip-large] [--batch 5]

Builds (once, cached under ~/.cache/coinfer/bench/<recipe key>/) a Llama-style
model of 134M parameters with random weights (speed does not depend on the
values), exports it with the quantize CLI's exporter and quantizes it with each
scheme, then runs ``quantize bench`` on FP32 and every INT8 scheme side by side;
the same for the demo draft model. Prints the tables and the issue-3 targets
(dynamic decode >= 2.5x faster than FP32 at batch 1, file <= 0.3x, session
creation faster) as ratios measured in this one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from coinfer.demo.models import cache_root
from coinfer.quantize import bench
from coinfer.quantize.artifact import staged
from coinfer.quantize.build import BuildOptions, int8_dir
from coinfer.quantize.gates import GateConfig
from coinfer.quantize.int8 import SCHEMES, QuantConfig


@dataclass(frozen=True)
class LargeRecipe:
    vocab: int = 32000
    hidden: int = 768
    intermediate: int = 2048
    layers: int = 12
    heads: int = 12
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def build_large(recipe: LargeRecipe) -> Path:
    """HF model dir with random weights + the demo tokenizer (ids < its vocab are valid here)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from coinfer.demo import tokenizer as chartok

    root = cache_root().parent / "bench" / recipe.key()
    hf = root / "hf"
    if (hf / "config.json").exists():
        return root
    torch.manual_seed(recipe.seed)
    cfg = LlamaConfig(
        vocab_size=recipe.vocab,
        hidden_size=recipe.hidden,
        intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=chartok.BOS_ID,
        eos_token_id=chartok.EOS_ID,
        pad_token_id=chartok.PAD_ID,
    )
    model = LlamaForCausalLM(cfg).eval()
    print(f"built random Llama: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters", file=sys.stderr)
    root.mkdir(parents=True, exist_ok=True)
    with staged(hf) as tmp:  # a crash leaves no half-written model behind
        model.save_pretrained(str(tmp))
        chartok.save(tmp)
    return root


def ensure_variants(root: Path, hf: Path, fp32: Path, gates: GateConfig | None) -> list[Path]:
    """[FP32, FP16, one dir per INT8 scheme] under ``root`` (built once)."""
    from coinfer.quantize.export import export_dir

    root.mkdir(parents=True, exist_ok=True)
    from coinfer.demo.artifacts import EXPORT_SOURCES, INT8_SOURCES, artifact_key

    fp16 = root / f"onnx-fp16-{artifact_key(EXPORT_SOURCES)}"
    if not (fp16 / "manifest.json").exists():
        export_dir(hf, fp16, parity_prompt=[1, 10, 20, 30, 40], parity_steps=4, dtype="fp16")
    dirs = [fp32, fp16]
    for scheme in SCHEMES:
        cfg = QuantConfig(scheme=scheme, calib_prompts=16, calib_decode_steps=4)
        # keyed by the quantization recipe and the code that builds it: never a stale model
        key = hashlib.sha256((repr(cfg) + artifact_key(INT8_SOURCES)).encode()).hexdigest()[:8]
        out = root / f"int8-{scheme}-{key}"
        if not (out / "manifest.json").exists():
            int8_dir(fp32, out, cfg, BuildOptions(gates=gates, keep_failed=True))
        dirs.append(out)
    return dirs


def prepare(skip_large: bool) -> dict[str, list[Path]]:
    """name -> [FP32, FP16, INT8 dynamic, static, weight-only] directories, built once and cached."""
    from coinfer.demo.artifacts import ensure_artifacts
    from coinfer.quantize.export import export_dir

    art = ensure_artifacts()
    out = {"demo-draft": ensure_variants(art.models.root / "bench", art.models.draft, art.draft_onnx, GateConfig())}
    if not skip_large:
        root = build_large(LargeRecipe())
        from coinfer.demo.artifacts import EXPORT_SOURCES, artifact_key

        fp32 = root / f"onnx-fp32-{artifact_key(EXPORT_SOURCES)}"
        if not (fp32 / "manifest.json").exists():
            export_dir(root / "hf", fp32, parity_prompt=[1, 10, 20, 30, 40], parity_steps=4)
        out["llama-134M-random"] = ensure_variants(root, root / "hf", fp32, None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-large", action="store_true", help="only the demo draft")
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--prepare-only", action="store_true", help="build and cache every variant, measure nothing")
    ap.add_argument(
        "--list-dirs",
        action="store_true",
        help="print each model's directories on one line, FP16 first (the GPU script's baseline)",
    )
    args = ap.parse_args(argv)
    models = prepare(args.skip_large)
    if args.prepare_only:
        return 0
    if args.list_dirs:
        for dirs in models.values():
            print(" ".join(str(d) for d in [dirs[1], dirs[0], *dirs[2:]]))
        return 0
    cfg = bench.BenchConfig(batch=args.batch)
    results = {name: bench.run(dirs, cfg) for name, dirs in models.items()}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for name, res in results.items():
        print(f"\n## {name}\n{bench.table(res)}")
        dyn = next(r for r in res["rows"] if r["scheme"] == "dynamic")
        print(
            f"dynamic vs FP32: decode b1 {dyn['speedup_b1']:.2f}x faster (target >= 2.5x), file "
            f"{dyn['size_ratio']:.2f}x (target <= 0.3x), session creation {dyn['session_ratio']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
