"""One ONNX causal LM with a KV cache on ONNX Runtime: session, feeds, one step.

The graph layout is Optimum's ``text-generation-with-past`` (see
``coinfer.quantize.decoder_graph``): ``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.N.key|value`` -> ``logits``, ``present.N.key|value``. The
edge's draft engine decodes with it, and the quantize CLI calibrates, gates and
benchmarks models with the very same code, so a check measures what the edge runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

ACCELERATORS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
KV_CACHE_KEY = "coinfer.kv_cache"
"""Graph metadata: "buffer" when attention is GroupQueryAttention over a cache that may be a
preallocated buffer written in place (``quantize/gqa_op.py``); absent or "concat" otherwise."""


def model_files(model_dir: Path) -> list[Path]:
    """The graph and external-weight files of a model directory (what a cold start reads)."""
    return sorted(
        p for p in Path(model_dir).iterdir() if p.suffix in (".onnx", ".data") or p.name.endswith(".onnx_data")
    )


def default_providers() -> list[str]:
    """CUDA when this onnxruntime build has it, else CPU (TensorRT only when asked for)."""
    avail = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in avail]


def session_options(threads: int | None = None, profile: bool = False) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.enable_profiling = profile
    return opts


Past = list  # list[np.ndarray] on the numpy path, list[ort.OrtValue] (device-resident) with IO binding


class Buffers(list):
    """A preallocated KV cache: one [B, H_kv, capacity, D] OrtValue per past input, on the session's
    device, of which the first ``length`` positions are filled. Each step binds every buffer as its
    layer's past input *and* present output, and the GroupQueryAttention node writes the new keys
    and values in place: no concatenation, no reallocation, no host round trip per step."""

    def __init__(self, values: list, length: int, capacity: int) -> None:
        super().__init__(values)
        self.length, self.capacity = length, capacity


def _length(past: Past) -> int:
    if isinstance(past, Buffers):
        return past.length
    return past[0].shape()[2] if isinstance(past[0], ort.OrtValue) else past[0].shape[2]


class OnnxLM:
    """``step(ids, past) -> (last-position logits, present)`` over one InferenceSession.

    With IO binding (default on CUDA) the KV cache never leaves the device between steps:
    ``present`` comes back as device OrtValues and is bound as the next ``past``; only the
    last position's logits are copied to the host for sampling. Tiling the cache for N
    drafts and dropping finished rows (``tile`` / ``select``) go through the host, once per
    request and once per finished draft.
    """

    def __init__(
        self,
        model_path: Path | str,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        profile: bool = False,
        io_binding: bool | None = None,
    ) -> None:
        self.path = Path(model_path)
        self.session = ort.InferenceSession(
            str(self.path),
            sess_options=session_options(threads, profile),
            providers=list(providers) if providers else default_providers(),
        )
        on_cuda = self.session.get_providers()[0] == "CUDAExecutionProvider"
        self.io_binding = on_cuda if io_binding is None else io_binding
        self.device = "cuda" if on_cuda else "cpu"
        inputs = self.session.get_inputs()
        self.past_names = [i.name for i in inputs if i.name.startswith("past_key_values.")]
        missing = {"input_ids", "attention_mask", "position_ids"} - {i.name for i in inputs}
        if missing or not self.past_names:
            raise ValueError(
                f"{self.path}: not a causal LM with a KV cache (inputs lack "
                f"{', '.join(sorted(missing)) or 'past_key_values.*'})"
            )
        shape = next(i.shape for i in inputs if i.name == "past_key_values.0.key")
        self.kv_heads, self.head_dim = int(shape[1]), int(shape[3])
        past_type = next(i.type for i in inputs if i.name == "past_key_values.0.key")
        self.dtype = np.float16 if "float16" in past_type else np.float32
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.kv_buffer = self.session.get_modelmeta().custom_metadata_map.get(KV_CACHE_KEY) == "buffer"
        """The graph can write its cache in place: ``empty_past(capacity)`` preallocates it."""

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def empty_past(self, capacity: int = 0) -> Past:
        """An empty batch-1 cache: preallocated ``Buffers`` of ``capacity`` positions where the graph
        writes in place (and a capacity is given), else zero-length arrays the graph concatenates onto."""
        if self.kv_buffer and capacity > 0:
            shape = (1, self.kv_heads, capacity, self.head_dim)
            return Buffers(
                [
                    ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, self.dtype), self.device, 0)
                    for _ in self.past_names
                ],
                0,
                capacity,
            )
        return [np.zeros((1, self.kv_heads, 0, self.head_dim), self.dtype) for _ in self.past_names]

    def _host(self, x) -> np.ndarray:
        return x.numpy() if isinstance(x, ort.OrtValue) else x

    def _device(self, arr: np.ndarray):
        return ort.OrtValue.ortvalue_from_numpy(arr, self.device, 0) if self.io_binding else arr

    def tile(self, past: Past, n: int) -> Past:
        """Repeat a batch-1 cache for ``n`` drafts."""
        if isinstance(past, Buffers):
            return Buffers(
                [ort.OrtValue.ortvalue_from_numpy(np.repeat(p.numpy(), n, axis=0), self.device, 0) for p in past],
                past.length,
                past.capacity,
            )
        return [self._device(np.repeat(self._host(p), n, axis=0)) for p in past]

    def select(self, past: Past, rows: np.ndarray) -> Past:
        """Keep only ``rows`` of the batch (finished drafts leave it)."""
        if isinstance(past, Buffers):
            return Buffers(
                [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(p.numpy()[rows]), self.device, 0) for p in past],
                past.length,
                past.capacity,
            )
        return [self._device(np.ascontiguousarray(self._host(p)[rows])) for p in past]

    def feed(self, ids: np.ndarray, past: Past) -> dict[str, np.ndarray]:
        """The input dict of one step (also what calibration records)."""
        b, t = ids.shape
        p = _length(past)
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones((b, p + t), np.int64),
            "position_ids": np.broadcast_to(np.arange(p, p + t, dtype=np.int64), (b, t)).copy(),
        }
        feed.update(zip(self.past_names, past))
        return feed

    def step(self, ids: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        """Run ``ids`` [B, T] after ``past``; float32 logits of the last position [B, V] and the new cache."""
        if isinstance(past, Buffers):
            return self._step_in_place(ids, past)
        if not self.io_binding:
            out = self.session.run(self.output_names, self.feed(ids, past))
            return out[0][:, -1, :].astype(np.float32), out[1:]
        binding = self._bound_inputs(ids, past)
        for name in self.output_names[1:]:
            binding.bind_output(name, self.device)
        self.session.run_with_iobinding(binding)
        out = binding.get_outputs()
        return out[0].numpy()[:, -1, :].astype(np.float32), list(out[1:])

    def _bound_inputs(self, ids: np.ndarray, past: Past) -> ort.IOBinding:
        """An IO binding with this step's inputs bound (device values as they are) and the logits
        bound to the host, the only output sampling reads."""
        binding = self.session.io_binding()
        for name, value in self.feed(ids, past).items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, value)
        binding.bind_output(self.output_names[0], "cpu")
        return binding

    def _step_in_place(self, ids: np.ndarray, past: Buffers) -> tuple[np.ndarray, Buffers]:
        if past.length + ids.shape[1] > past.capacity:
            raise ValueError(f"KV buffer full: {past.length} + {ids.shape[1]} tokens > capacity {past.capacity}")
        binding = self._bound_inputs(ids, past)
        for name, buf in zip(self.output_names[1:], past):  # present.N is past_key_values.N: written in place
            binding.bind_ortvalue_output(name, buf)
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()
        return logits[:, -1, :].astype(np.float32), Buffers(list(past), past.length + ids.shape[1], past.capacity)

    def greedy(
        self, prompt_ids: list[int], steps: int, stop_ids: set[int] | frozenset[int] = frozenset()
    ) -> tuple[list[int], list[np.ndarray]]:
        """Greedy continuation of ``prompt_ids`` (batch 1): (tokens, logits before each token)."""
        logits, past = self.step(np.array([prompt_ids], np.int64), self.empty_past(len(prompt_ids) + steps))
        tokens, seen = [], []
        for _ in range(steps):
            seen.append(logits[0])
            tok = int(logits[0].argmax())
            tokens.append(tok)
            if tok in stop_ids:
                break
            logits, past = self.step(np.array([[tok]], np.int64), past)
        return tokens, seen

    def forced(self, prompt_ids: list[int], tokens: list[int]) -> list[np.ndarray]:
        """Logits before each of ``tokens`` when the model is fed them one by one (teacher forcing on the KV path)."""
        logits, past = self.step(np.array([prompt_ids], np.int64), self.empty_past(len(prompt_ids) + len(tokens)))
        seen = [logits[0]]
        for tok in tokens[:-1]:
            logits, past = self.step(np.array([[tok]], np.int64), past)
            seen.append(logits[0])
        return seen
