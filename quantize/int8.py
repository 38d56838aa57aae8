"""INT8 quantization of an exported draft model (per-channel MatMul weights).

Scheme ``dynamic``: per-channel int8 weights of every MatMul (the LM head
included), activations quantized at run time (ONNX Runtime's MatMulInteger /
DynamicQuantizeLinear; the CPU VNNI path). Embeddings (Gather) and norm weights
stay float: they are not MatMul inputs, and per-tensor quantization of them
broke a test model completely (issue 3). ``static`` (QDQ with calibration) and
``weight-only`` (MatMulNBits for CUDA) are still to come.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from coinfer.manifest import sha256_file, write_manifest
from quantize.check import check_structure
from quantize.export import MODEL_FILE, TOKENIZER_FILES, ExportError

log = logging.getLogger(__name__)
SCHEMES = ("dynamic",)


def quantize_dir(src_dir: Path, out_dir: Path, scheme: str = "dynamic", per_channel: bool = True) -> dict:
    """Quantize ``src_dir/model.onnx`` into ``out_dir`` (model + tokenizer), atomically.

    ``per_channel=False`` exists to build deliberately wrong (per-tensor) models for
    the structure check's tests; the CLI never passes it.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if scheme not in SCHEMES:
        raise ValueError(f"scheme: unknown {scheme!r} (known: {', '.join(SCHEMES)})")
    src = src_dir / MODEL_FILE
    if not src.is_file():
        raise ExportError(f"{src}: missing; expected an exported model directory")
    if out_dir.exists():
        raise ExportError(f"{out_dir}: output directory exists")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        quantize_dynamic(str(src), str(tmp / MODEL_FILE), per_channel=per_channel, weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"])
        for name in TOKENIZER_FILES:
            if (src_dir / name).exists():
                shutil.copy2(src_dir / name, tmp / name)
        report = {"scheme": scheme, "per_channel": per_channel, "weight_type": "int8",
                  "bytes": (tmp / MODEL_FILE).stat().st_size, "source_bytes": src.stat().st_size}
        checked, problems = check_structure(tmp / MODEL_FILE)
        report.update(weights_checked=checked, structure_problems=problems)
        write_manifest(tmp, {
            "scheme": scheme, "params": {"per_channel": per_channel, "weight_type": "int8", "ops": ["MatMul"]},
            "source": {"path": str(src_dir), "sha256": sha256_file(src)},
            "tokenizer_sha256": sha256_file(tmp / "tokenizer.json") if (tmp / "tokenizer.json").exists() else None,
            "providers": ["CPUExecutionProvider"],
            "checks": {"structure": {"weights_checked": checked, "problems": problems}},
        })
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return report
