"""Calibration probes: disk, PCIe, session creation, decode step time by batch size, network
(Probe RPC) and cloud queue (Status RPC). Each returns numbers or None ("unavailable");
failures never raise into the planner."""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def drop_page_cache(path: Path) -> bool:
    """Evict ``path`` from the page cache (POSIX_FADV_DONTNEED; clean pages, no root needed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except (OSError, AttributeError):
        return False


def read_cold(paths: list[Path]) -> tuple[float, bool]:
    """(seconds to read ``paths`` whole, whether their page cache could be dropped first)."""
    dropped = all([drop_page_cache(p) for p in paths])
    t0 = time.perf_counter()
    for path in paths:
        with path.open("rb") as f:
            while f.read(1 << 24):
                pass
    return time.perf_counter() - t0, dropped


def disk_read_bps(path: Path) -> float | None:
    """Bytes/s reading ``path`` cold (page cache dropped first)."""
    try:
        seconds, _ = read_cold([path])
        return path.stat().st_size / max(seconds, 1e-9)
    except OSError as exc:
        log.warning("disk probe failed: %s", exc)
        return None


def pcie_h2d_bps(nbytes: int = 64 << 20) -> float | None:
    """Host -> device bytes/s through ONNX Runtime's CUDA allocator; None without CUDA."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    try:
        host = np.ones(nbytes // 4, np.float32)
        ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)  # first copy pays for context creation
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)
            best = min(best, time.perf_counter() - t0)
        return nbytes / best
    except Exception as exc:  # noqa: BLE001 - a broken driver is "unavailable", not a crash
        log.warning("PCIe probe failed: %s", exc)
        return None


def decode_steps(
    lm, sizes: tuple[int, ...] = (1, 2, 5, 8), steps: int = 6, prompt_tokens: int = 32, warmup: int = 1
) -> tuple[float, dict[int, float]]:
    """(prefill ms per prompt token, {batch size: median of ``steps`` decode step ms after ``warmup``})
    on a loaded OnnxLM; the prompt cache is tiled to each batch size, as the edge drafts."""
    prompt = np.array([[4 + i % 16 for i in range(prompt_tokens)]], np.int64)
    room = prompt_tokens + warmup + steps  # a graph that writes its cache in place gets buffers this long
    lm.step(prompt, lm.empty_past(room))  # warm
    t0 = time.perf_counter()
    logits, past0 = lm.step(prompt, lm.empty_past(room))
    prefill = (time.perf_counter() - t0) * 1e3 / prompt_tokens
    out = {}
    for n in sizes:
        ids = np.repeat(logits.argmax(-1, keepdims=True).astype(np.int64), n, axis=0)
        past = lm.tile(past0, n)
        times = []
        for _ in range(warmup + steps):
            t = time.perf_counter()
            lg, past = lm.step(ids, past)
            times.append((time.perf_counter() - t) * 1e3)
            ids = lg.argmax(-1, keepdims=True).astype(np.int64)
        out[n] = statistics.median(times[warmup:])
    return prefill, out


async def network(stub, payload: int = 64 << 10, reps: int = 5, timeout: float = 10.0) -> dict[str, float] | None:
    """RTT (empty Probe, median) and up/down bandwidth (``payload`` bytes each way, RTT subtracted)."""
    import grpc

    from coinfer.v1 import coinfer_pb2 as pb

    try:
        rtts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            await stub.Probe(pb.ProbeRequest(), timeout=timeout)
            rtts.append((time.perf_counter() - t0) * 1e3)
        rtt = statistics.median(rtts)
        t0 = time.perf_counter()
        await stub.Probe(pb.ProbeRequest(payload=b"\0" * payload), timeout=timeout)
        up_s = max((time.perf_counter() - t0) * 1e3 - rtt, 0.05) / 1e3
        t0 = time.perf_counter()
        await stub.Probe(pb.ProbeRequest(response_bytes=payload), timeout=timeout)
        down_s = max((time.perf_counter() - t0) * 1e3 - rtt, 0.05) / 1e3
        return {"rtt_ms": rtt, "up_bps": payload / up_s, "down_bps": payload / down_s}
    except grpc.aio.AioRpcError as exc:
        log.warning("network probe failed: %s", exc.code().name)
        return None


async def cloud_status(stub, timeout: float = 5.0) -> dict[str, float] | None:
    import grpc

    from coinfer.v1 import coinfer_pb2 as pb

    try:
        st = await stub.Status(pb.StatusRequest(), timeout=timeout)
        return {
            "queue_depth": float(st.queue_depth),
            "running": float(st.running),
            "load": float(st.load),
            "ready": float(st.ready),
        }
    except grpc.aio.AioRpcError as exc:
        log.warning("status probe failed: %s", exc.code().name)
        return None


def observe_queue(est, queue_depth: float) -> None:
    """Queue wait: requests ahead of us, each costing about one refinement."""
    per = est.get("refine_ttft_ms") + est.mean("decode_steps.split") * est.get("refine_ms_per_token")
    est.observe("queue_ms", queue_depth * per, replace=True)


async def calibrate(est, model_path: Path | None = None, lm=None, stub=None) -> list[str]:
    """Run the probes that apply and fold them into ``est`` (fresh values replace old ones).
    Returns what was probed. Blocking probes run in a worker thread. Session creation and
    warm-up are measured by the load itself (``EdgeCore.ensure_engine``)."""
    import asyncio

    done = []
    # what each probe measures: a failed one says whether an earlier measurement still stands
    keys = {
        "disk": ("disk_read_bps",),
        "decode": ("step_ms.1", "prefill_ms_per_token"),
        "network": ("rtt_ms", "up_bps", "down_bps"),
        "status": ("queue_ms",),
    }

    def failed(what: str, why: str) -> None:
        kept = "keeping the last measurement" if any(est.has(k) for k in keys[what]) else "using defaults"
        est.note(f"{what} probe failed ({why}); {kept}", key=f"{what} probe failed")

    def ok(what: str) -> None:  # a probe that works again clears its failure from --explain
        est.forget(f"{what} probe failed")
        done.append(what)

    if model_path is not None:
        bps = await asyncio.to_thread(disk_read_bps, model_path)
        if bps is None:
            failed("disk", f"cannot read {model_path}")
        elif est.observe("disk_read_bps", bps, replace=True):
            ok("disk")
        pcie = await asyncio.to_thread(pcie_h2d_bps)
        if pcie is None:
            est.note("pcie_h2d_bps: unavailable (no CUDA); the cold-start model has no PCIe term")
        elif est.observe("pcie_h2d_bps", pcie, replace=True):
            done.append("pcie")
    if lm is not None:
        try:
            prefill, steps = await asyncio.to_thread(decode_steps, lm)
        except Exception as exc:  # noqa: BLE001 - a failing probe must not take the daemon down
            failed("decode", f"{type(exc).__name__}: {exc}")
        else:
            est.observe("prefill_ms_per_token", prefill, replace=True)
            for n, ms in steps.items():
                est.observe(f"step_ms.{n}", ms, replace=True)
            ok("decode")
    if stub is not None:
        net = await network(stub)
        if net is None:
            failed("network", "Probe RPC failed")
        else:
            for k, v in net.items():
                est.observe(k, v, replace=True)
            ok("network")
        st = await cloud_status(stub)
        if st is None:
            failed("status", "Status RPC failed")
        else:
            observe_queue(est, st["queue_depth"])
            ok("status")
    est.save()
    return done
