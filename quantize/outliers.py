"""Find the MatMuls whose inputs carry massive activation outliers, to leave them in float.

Real LLMs route a few activations orders of magnitude above the rest through a handful of layers
(LLM.int8(); "massive activations", mostly on the first token, in one or two ``down_proj``s).
Measured on SmolLM2-135M-Instruct: ``layers.11.mlp.down_proj`` sees max |x| 3,065 against a 99.9th
percentile of 1.98 (ratio 1,550), ``layers.28.mlp.down_proj`` 2,371 / 15.5 (153); the next is 56 and
most MatMuls are under 10. An 8-bit activation scale over such an input -- per tensor (static,
dynamic) or per 128-wide block (MatMulNBits at accuracy level 4) -- rounds the rest of its block to
a few levels. Random-weight and from-scratch models have no such inputs: they keep every MatMul.

``activation_outliers`` runs the FP32 export on calibration prompts (prefill and a few greedy decode
steps, ``coinfer.quantize.calibrate``) with every weight MatMul's input as an extra graph output, and
reports per MatMul (by the module it was exported from) the max |x| and the 99.9th percentile.
``QuantConfig.keep_float = ("auto",)`` keeps those whose ratio reaches ``AUTO_RATIO``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from coinfer.quantize.prompts import TaskPrompt

AUTO_RATIO = 100.0
"""max |x| / p99.9 |x| at which a MatMul stays float: SmolLM2's two massive-activation layers are at
153 and 1,550, its next at 56; every MatMul of the demo draft and the random test families is far
below."""


def activation_outliers(src: Path, prompts: Sequence[TaskPrompt], decode_steps: int = 2) -> dict[str, dict]:
    """{module: {"max", "p999", "ratio"}} of every weight MatMul's input over ``prompts``."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from coinfer.quantize.calibrate import KvCalibrationReader
    from coinfer.quantize.int8 import module_of

    model = onnx.load(str(src))
    inits = {i.name for i in model.graph.initializer}
    nodes = {n.input[0]: n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    dtype = {i.name: i.data_type for i in model.graph.initializer}
    elem = next((dtype[n.input[1]] for n in nodes.values()), onnx.TensorProto.FLOAT)
    known = {o.name for o in model.graph.output}
    for name in nodes:
        if name not in known:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
    with tempfile.TemporaryDirectory(prefix="outliers-", dir=src.parent) as tmp:
        probe = Path(tmp) / "probe.onnx"
        onnx.save(model, str(probe), save_as_external_data=model.ByteSize() > 2**31 - 2**20)
        del model
        sess = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
        names = list(nodes)
        inputs = {i.name for i in sess.get_inputs()}
        reader = KvCalibrationReader(
            src, Tokenizer.from_file(str(src.parent / "tokenizer.json")), prompts, decode_steps
        )
        peak = dict.fromkeys(names, 0.0)
        p999 = dict.fromkeys(names, 0.0)
        while (feed := reader.get_next()) is not None:
            feed = {k: v for k, v in feed.items() if k in inputs}
            for name, x in zip(names, sess.run(names, feed)):
                a = np.abs(x.astype(np.float32, copy=False)).ravel()
                peak[name] = max(peak[name], float(a.max(initial=0.0)))
                p999[name] = max(p999[name], float(np.quantile(a, 0.999)) if a.size else 0.0)
    out: dict[str, dict] = {}
    for name in names:
        module = module_of(nodes[name])
        ratio = peak[name] / max(p999[name], 1e-6)
        out[module] = {"max": round(peak[name], 2), "p999": round(p999[name], 3), "ratio": round(ratio, 1)}
    return out


def outlier_modules(stats: dict[str, dict], ratio: float = AUTO_RATIO) -> list[str]:
    """The modules whose input ratio reaches ``ratio``, worst first."""
    return [m for m, s in sorted(stats.items(), key=lambda kv: -kv[1]["ratio"]) if s["ratio"] >= ratio]
