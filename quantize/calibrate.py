"""Calibration data for static (QDQ) quantization: real prompts, real KV caches.

The edge spends almost all its time in decode steps (one new token over a
growing cache), whose activations differ from a prefill's. So every prompt
contributes its prefill *and* the decode steps of the FP32 model's own greedy
continuation, each fed with the cache that continuation really produced, not
random tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader
from tokenizers import Tokenizer

from coinfer.chat import ChatFormat
from coinfer.edge.onnx_lm import OnnxLM
from coinfer.quantize.prompts import TaskPrompt


class KvCalibrationReader(CalibrationDataReader):
    """Feeds of the FP32 model running ``prompts``: prefill, then ``decode_steps`` greedy steps each."""

    def __init__(
        self,
        fp32_model: Path,
        tokenizer: Tokenizer,
        prompts: Sequence[TaskPrompt],
        decode_steps: int = 8,
        on_prompt=None,
        chat: ChatFormat | None = None,
    ) -> None:
        self.lm = OnnxLM(fp32_model, providers=["CPUExecutionProvider"])
        self.tokenizer = tokenizer
        self.chat = chat or ChatFormat.from_dir(fp32_model.parent)
        self.prompts = list(prompts)
        self.decode_steps = decode_steps
        self.on_prompt = on_prompt  # progress callback, once per prompt
        self.feeds = 0
        self._it: Iterator[dict[str, np.ndarray]] | None = None

    def _generate(self) -> Iterator[dict[str, np.ndarray]]:
        for p in self.prompts:
            ids = np.array([p.ids(self.tokenizer, self.chat)], np.int64)
            past = self.lm.empty_past()
            for _ in range(self.decode_steps + 1):
                feed = self.lm.feed(ids, past)
                self.feeds += 1
                yield feed
                logits, past = self.lm.step(ids, past)
                ids = logits.argmax(-1, keepdims=True).astype(np.int64)
            if self.on_prompt is not None:
                self.on_prompt()

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._it is None:
            self._it = self._generate()
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = None
