"""The edge's GPU check on one NVIDIA machine, in minutes: where each model's nodes run on the CUDA
execution provider, decode speed there against the CPU, and batched drafting through the edge's engine.

    python -m benchmarks.gpu_check --out DIR [--budget-s 420] [--skip-large]

Needs onnxruntime-gpu (not onnxruntime) and torch (the export). Builds the demo draft's and the 134M
random Llama's variants (FP32, FP16, INT8 dynamic / static / weight-only; ``benchmarks.quantize_speed``),
then, model by model and while the time budget lasts:

1. placement: kernels per provider over a prefill and a decode step, and every compute node that fell
   back to CPU although CUDA was asked for (``coinfer.quantize.placement``);
2. decode ms/token at batch 1 and batch 5 on CUDA (FP16 the baseline), and FP32 / INT8 dynamic / weight-only on the
   CPU cores of the same machine, one run (``coinfer.quantize.bench``);
3. the edge's engine (``OrtDraftEngine``, IO binding on CUDA): 1 draft vs 5 drafts in one batch, for FP16,
   the default INT8 scheme and dynamic;
4. the same for the ``--kv-cache buffer`` exports (FP32, FP16, INT8 weight-only): ONNX Runtime's fused graph
   (GroupQueryAttention over a preallocated cache), a third of the kernels per step.

Each step's result is written to ``DIR/gpu_check.json`` as soon as it is known, so a run cut short by
its budget or its machine keeps what it measured. Exit status 3 when CUDA is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

CUDA = ("CUDAExecutionProvider", "CPUExecutionProvider")
CPU = ("CPUExecutionProvider",)
STEPS = ("placement", "decode", "drafting", "buffer")


class Report:
    """The results so far, rewritten to disk after every step."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.path = out / "gpu_check.json"
        self.data: dict = {"steps": {}}
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        out.mkdir(parents=True, exist_ok=True)

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def step(self, name: str, fn, *, needs_s: float = 0.0) -> object:
        """Run one step; record its result (or its error) and its seconds. Skipped when too little time is left."""
        if self.left_s() < needs_s:
            self.data["steps"][name] = {"skipped": f"{self.left_s():.0f} s left of the budget, {needs_s:.0f} needed"}
            self.save()
            print(f"[{self.elapsed():6.1f}s] {name}: skipped (budget)", flush=True)
            return None
        t = time.perf_counter()
        try:
            res = fn()
            rec = {"s": round(time.perf_counter() - t, 2), "result": res}
        except Exception as e:  # a step that fails must not lose the others' results
            res = None
            rec = {"s": round(time.perf_counter() - t, 2), "error": f"{type(e).__name__}: {e}"[:2000]}
            traceback.print_exc()
        self.data["steps"][name] = rec
        self.save()
        print(f"[{self.elapsed():6.1f}s] {name}: {json.dumps(rec, default=str)[:600]}", flush=True)
        return res

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def environment() -> dict:
    import onnxruntime as ort

    env = {
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "device": ort.get_device(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.cuda.is_available() and torch.cuda.get_device_name(0)
    except Exception as e:  # torch is only needed for the export
        env["torch"] = f"unavailable: {e}"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        env["gpu"] = smi.stdout.strip() or smi.stderr.strip()
    except FileNotFoundError:
        env["gpu"] = "no nvidia-smi"
    return env


def placement(model_dir: Path, providers: tuple[str, ...]) -> dict:
    from coinfer.quantize.placement import check_placement

    p = check_placement(model_dir / "model.onnx", list(providers))
    cpu_ops = p.by_op.get("CPUExecutionProvider", {})
    return {
        "session": p.session,
        "nodes": p.nodes,
        "fallback_count": len(p.fallback),
        "fallback_first": p.fallback[:8],
        "cpu_ops": cpu_ops,
        "problems": p.problems,
    }


def decode(dirs: list[Path], providers: tuple[str, ...], batch: int) -> list[dict]:
    from coinfer.quantize import bench

    res = bench.run(dirs, bench.BenchConfig(batch=batch, providers=providers), progress=False)
    keep = ("scheme", "providers", "file_bytes", "session_ms", "first_token_ms", "decode_ms_b1", "speedup_b1")
    return [
        {
            "model": Path(r["model"]).name,
            **{k: r.get(k) for k in keep},
            f"decode_ms_step_b{batch}": r[f"decode_ms_step_b{batch}"],
        }
        for r in res["rows"]
    ]


def drafting(model_dir: Path, providers: tuple[str, ...]) -> dict:
    """The edge engine's wall time for 1 draft and for 5 drafts of 64 tokens in one batch."""
    from benchmarks.edge_bench import batch_ratio

    return batch_ratio(model_dir, "If x=3 and y=5, compute (x+y)^2-x*y.\n", providers=providers)


def buffer_variants(name: str) -> dict:
    """The model's ``--kv-cache buffer`` exports (ONNX Runtime's fused graph: GroupQueryAttention over a
    preallocated cache, fused projections), built once: FP32, INT8 weight-only from it, FP16. Each that
    fails to build is reported by its error, the others kept."""
    from benchmarks.quantize_speed import LargeRecipe, build_large
    from coinfer.demo.artifacts import EXPORT_SOURCES, INT8_SOURCES, artifact_key, ensure_artifacts
    from coinfer.quantize.build import BuildOptions, int8_dir
    from coinfer.quantize.export import export_dir
    from coinfer.quantize.int8 import QuantConfig

    if name == "demo-draft":
        models = ensure_artifacts().models
        hf, root = models.draft, models.root / "bench-buffer"
        root.mkdir(exist_ok=True)
    else:
        root = build_large(LargeRecipe())
        hf = root / "hf"
    fp32, fp16 = (root / f"onnx-buffer-{dt}-{artifact_key(EXPORT_SOURCES)}" for dt in ("fp32", "fp16"))
    wo = root / f"int8-buffer-weight-only-{artifact_key(INT8_SOURCES)}"
    prompt = [1, 10, 20, 30, 40]
    builds = {
        fp32: lambda: export_dir(hf, fp32, parity_prompt=prompt, parity_steps=4, kv_cache="buffer"),
        wo: lambda: int8_dir(fp32, wo, QuantConfig(scheme="weight-only"), BuildOptions(gates=None, keep_failed=True)),
        fp16: lambda: export_dir(hf, fp16, parity_prompt=prompt, parity_steps=4, dtype="fp16", kv_cache="buffer"),
    }
    built, errors = [], {}
    for d, build in builds.items():
        try:
            if not (d / "manifest.json").exists():
                build()
            built.append(str(d))
        except Exception as e:  # one variant that does not build must not hide the others
            errors[d.name] = f"{type(e).__name__}: {e}"[:600]
    return {"dirs": built, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/coinfer-gpu")))
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds; later steps are skipped past it")
    ap.add_argument("--skip-large", action="store_true", help="only the demo draft")
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS, help="which measurements (default: all)")
    ap.add_argument(
        "--providers",
        nargs="+",
        default=list(CUDA),
        help="the accelerator's providers (a CPU rehearsal: CPUExecutionProvider)",
    )
    args = ap.parse_args(argv)
    accel = tuple(args.providers)
    rep = Report(args.out, args.budget_s)
    env = rep.step("environment", environment)
    if accel[0] not in (env or {}).get("providers", []):
        print(f"{accel[0]} is not in this onnxruntime build: install onnxruntime-gpu", file=sys.stderr)
        return 3
    from benchmarks.quantize_speed import prepare
    from coinfer.quantize.int8 import SCHEMES, QuantConfig

    models = rep.step("prepare", lambda: {k: [str(d) for d in v] for k, v in prepare(args.skip_large).items()}) or {}
    # the demo draft first (seconds), then the 134M model (what a real edge draft costs)
    for name, dirs in models.items():
        dirs = [Path(d) for d in dirs]  # FP32, FP16, INT8 dynamic, static, weight-only
        int8 = dict(zip(SCHEMES, dirs[2:]))
        if "placement" in args.steps:
            for d in dirs:
                rep.step(f"{name}/placement/{d.name}", lambda d=d: placement(d, accel), needs_s=20)
        if "decode" in args.steps:
            rep.step(f"{name}/decode/accel", lambda d=dirs: decode([d[1], d[0], *d[2:]], accel, 5), needs_s=60)
            rep.step(
                f"{name}/decode/cpu",
                lambda d=dirs, q=int8: decode([d[0], q["dynamic"], q["weight-only"]], CPU, 5),
                needs_s=60,
            )
        if "drafting" in args.steps:  # FP16, the default scheme and dynamic through the edge's engine
            for d in (dirs[1], int8[QuantConfig.scheme], int8["dynamic"]):
                rep.step(f"{name}/drafting/{d.name}", lambda d=d: drafting(d, accel), needs_s=30)
            d = int8[QuantConfig.scheme]
            rep.step(f"{name}/drafting/cpu/{d.name}", lambda d=d: drafting(d, CPU), needs_s=30)
        if "buffer" in args.steps:  # the fused graph: fewer, larger kernels per step
            made = rep.step(f"{name}/buffer/prepare", lambda n=name: buffer_variants(n), needs_s=30) or {}
            buf = [Path(d) for d in made.get("dirs", [])]
            for d in buf:
                rep.step(f"{name}/buffer/placement/{d.name}", lambda d=d: placement(d, accel), needs_s=20)
            if buf:  # beside the concat graph's FP16 (the baseline) and weight-only
                base = [dirs[1], int8[QuantConfig.scheme], *buf]
                rep.step(f"{name}/buffer/decode/accel", lambda b=base: decode(b, accel, 5), needs_s=60)
                for d in buf[1:]:
                    rep.step(f"{name}/buffer/drafting/{d.name}", lambda d=d: drafting(d, accel), needs_s=30)
    rep.data["total_s"] = round(rep.elapsed(), 1)
    rep.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
