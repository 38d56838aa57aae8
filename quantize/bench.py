"""``bench``: cold start, decode speed, memory and size of model directories, side by side.

Each model is measured in its own fresh process (so peak RSS and cold start are
its own), one after the other (so they never compete for the cores):

- cold start: reading the file with the page cache for it dropped first
  (``posix_fadvise(DONTNEED)``; reported if that was not possible), session
  creation (graph optimisation, weight prepacking), first token (prefill of a
  ``prompt_tokens`` prompt);
- decode: median ms per step at batch 1 and at batch N (N drafts of one prompt, as
  the edge runs them), after warm-up steps;
- peak RSS of the process, file size;
- the memory-bandwidth floor: a decode step must read every weight once, so
  ``weight bytes / measured read bandwidth`` is the fastest a step can be; the
  ratio floor / measured says how close the kernels get.

Ratios are against the first model given (the FP32 baseline), measured in this run. On a shared or
throttling machine the speed of the cores drifts over a run; with ``rounds`` > 1 the models are
measured in turn, round after round (A B A B ...), and each time is the median over the rounds, so
a slow minute lands on every model alike instead of on whichever ran in it.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from coinfer.edge.planner.probes import decode_steps, read_cold


@dataclass(frozen=True)
class BenchConfig:
    batch: int = 5
    """Drafts per batch for the batched decode measurement (the edge's default n)."""
    prompt_tokens: int = 32
    decode_steps: int = 32
    warmup_steps: int = 3
    threads: int = 0
    """ONNX Runtime intra-op threads; 0 = all cores."""
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    rounds: int = 1
    """Measurements of each model, taken in turn with the others'; each time reported is their median."""

    def validate(self) -> None:
        if not 1 <= self.batch <= 64:
            raise ValueError(f"batch: must be in 1..64, got {self.batch}")
        if not 1 <= self.prompt_tokens <= 4096 or not 1 <= self.decode_steps <= 4096:
            raise ValueError("prompt_tokens / decode_steps: must be in 1..4096")
        if not 1 <= self.rounds <= 20:
            raise ValueError(f"rounds: must be in 1..20, got {self.rounds}")
        if not 0 <= self.warmup_steps <= 100 or not 0 <= self.threads <= 256:
            raise ValueError("warmup_steps / threads: out of range (0..100 / 0..256)")


def measure(model_dir: Path, cfg: BenchConfig) -> dict:
    """One model, in this process (the worker side of ``bench``)."""
    from coinfer.edge.onnx_lm import OnnxLM, model_files

    files = model_files(model_dir)
    read_s, dropped = read_cold(files)
    t0 = time.perf_counter()
    lm = OnnxLM(model_dir / "model.onnx", providers=list(cfg.providers), threads=cfg.threads or None)
    session_ms = (time.perf_counter() - t0) * 1e3
    prompt = np.array([[4 + i % 16 for i in range(cfg.prompt_tokens)]], np.int64)
    t0 = time.perf_counter()
    lm.step(prompt, lm.empty_past(cfg.prompt_tokens + 1))[0].argmax(-1)
    first_token_ms = (time.perf_counter() - t0) * 1e3
    _, steps = decode_steps(
        lm, sizes=(1, cfg.batch), steps=cfg.decode_steps, prompt_tokens=cfg.prompt_tokens, warmup=cfg.warmup_steps
    )
    return {
        "model": str(model_dir),
        "providers": lm.providers,
        "file_bytes": sum(f.stat().st_size for f in files),
        "page_cache_dropped": dropped,
        "read_ms": read_s * 1e3,
        "session_ms": session_ms,
        "first_token_ms": first_token_ms,
        "decode_ms_b1": steps[1],
        f"decode_ms_step_b{cfg.batch}": steps[cfg.batch],
        "batch": cfg.batch,
        "peak_rss_mb": peak_rss_mb(),
    }


def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss across execve, so a
    worker started from a big parent would report the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_bandwidth_gbs(mib: int = 512, threads: int | None = None, repeats: int = 5) -> float:
    """Best-of-``repeats`` read bandwidth of summing a ``mib`` MiB array in ``threads`` threads (GB/s)."""
    threads = threads or os.cpu_count() or 1
    a = np.ones(mib * (1 << 20) // 4, np.float32)
    chunks = np.array_split(a, threads)
    best = float("inf")
    for _ in range(repeats):
        ts = [threading.Thread(target=np.add.reduce, args=(c,)) for c in chunks]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


def weight_bytes(model_path: Path) -> dict:
    """Bytes of initializers a decode step reads: all of them except embedding tables (Gather reads one row)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    sizes = {}
    for init in model.graph.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        sizes[init.name] = n * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    gathered = {n.input[0] for n in model.graph.node if n.op_type in ("Gather", "GatherBlockQuantized")}
    total = sum(sizes.values())
    return {"initializer_bytes": total, "read_per_token_bytes": total - sum(sizes.get(g, 0) for g in gathered)}


def run(model_dirs: list[Path], cfg: BenchConfig = BenchConfig(), progress: bool = True) -> dict:
    from tqdm import tqdm

    cfg.validate()
    for d in model_dirs:
        if not (d / "model.onnx").is_file():
            raise ValueError(f"{d / 'model.onnx'}: missing; bench takes model directories")
    bw = read_bandwidth_gbs(threads=cfg.threads or None)
    runs: dict[Path, list[dict]] = {d: [] for d in model_dirs}
    with tqdm(total=cfg.rounds * len(model_dirs), desc="bench", unit="run", disable=not progress) as bar:
        for _ in range(cfg.rounds):
            for d in model_dirs:
                runs[d].append(_measure_in_child(d, cfg))
                bar.update()
    rows = []
    for d in model_dirs:
        row = _median_row(runs[d])
        manifest = d / "manifest.json"
        row["scheme"] = json.loads(manifest.read_text()).get("scheme", "?") if manifest.exists() else "?"
        row.update(weight_bytes(d / "model.onnx"))
        row["floor_ms"] = row["read_per_token_bytes"] / (bw * 1e9) * 1e3
        row["floor_over_measured_b1"] = row["floor_ms"] / row["decode_ms_b1"]
        rows.append(row)
    base = rows[0]
    key = f"decode_ms_step_b{cfg.batch}"
    for r in rows:
        r["speedup_b1"] = base["decode_ms_b1"] / r["decode_ms_b1"]
        r[f"speedup_b{cfg.batch}"] = base[key] / r[key]
        r["size_ratio"] = r["file_bytes"] / base["file_bytes"]
        r["session_ratio"] = r["session_ms"] / base["session_ms"]
        r["batch_cost"] = r[key] / r["decode_ms_b1"]  # wall of N drafts' step / one draft's step
    return {"config": asdict(cfg), "read_bandwidth_gbs": bw, "cpu_count": os.cpu_count(), "rows": rows}


def _measure_in_child(model_dir: Path, cfg: BenchConfig) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "coinfer.quantize.bench", str(model_dir), json.dumps(asdict(cfg))],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{model_dir}: benchmark process failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median_row(runs: list[dict]) -> dict:
    """One row from a model's rounds: the median of every time, the largest peak RSS."""
    row = dict(runs[0])
    for key in runs[0]:
        if key.endswith("_ms") or key.startswith("decode_ms"):
            row[key] = statistics.median(r[key] for r in runs)
    row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    row["rounds"] = len(runs)
    return row


def table(result: dict) -> str:
    b = result["config"]["batch"]
    head = [
        "model",
        "scheme",
        "MB",
        "size x",
        "read ms",
        "session ms",
        "session x",
        "1st tok ms",
        "b1 ms/tok",
        "b1 speedup",
        f"b{b} ms/step",
        f"b{b} ms/tok",
        f"b{b} step/b1",
        "floor ms",
        "floor/meas",
        "RSS MB",
    ]
    lines = []
    for r in result["rows"]:
        lines.append(
            [
                Path(r["model"]).name,
                r["scheme"],
                f"{r['file_bytes'] / 1e6:.1f}",
                f"{r['size_ratio']:.2f}",
                f"{r['read_ms']:.0f}",
                f"{r['session_ms']:.0f}",
                f"{r['session_ratio']:.2f}",
                f"{r['first_token_ms']:.1f}",
                f"{r['decode_ms_b1']:.2f}",
                f"{r['speedup_b1']:.2f}x",
                f"{r[f'decode_ms_step_b{b}']:.2f}",
                f"{r[f'decode_ms_step_b{b}'] / b:.2f}",
                f"{r['batch_cost']:.2f}",
                f"{r['floor_ms']:.2f}",
                f"{r['floor_over_measured_b1']:.2f}",
                f"{r['peak_rss_mb']:.0f}",
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [fmt.format(*head)] + [fmt.format(*row) for row in lines]
    rounds = result["config"].get("rounds", 1)
    out.append(
        f"read bandwidth {result['read_bandwidth_gbs']:.1f} GB/s on {result['cpu_count']} cores; "
        "floor = weight bytes read per step / bandwidth; ratios against the first row"
        + (f"; times are medians of {rounds} rounds, models measured in turn" if rounds > 1 else "")
    )
    return "\n".join(out)


if __name__ == "__main__":  # worker: python -m coinfer.quantize.bench DIR CONFIG_JSON
    cfg = json.loads(sys.argv[2])
    cfg["providers"] = tuple(cfg["providers"])
    print(json.dumps(measure(Path(sys.argv[1]), BenchConfig(**cfg))))
