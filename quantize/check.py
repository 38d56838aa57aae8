"""Structure check of an INT8 model: per-channel weights done right (000 article, 4.4).

Every quantized MatMul weight must carry float32 scales and zero points with one
entry per output channel, on the output axis, and int8/uint8 zero points:

- ``MatMulInteger`` (dynamic): 1-D scale and zero point of length N for B [K, N];
- ``DequantizeLinear`` of a weight (static QDQ): the same, and ``axis`` = 1 (N);
- ``MatMulNBits`` (weight-only): 8 bits, scales and zero points [N, K-blocks]
  (per output channel and block along K).

A per-tensor (scalar) scale or zero point, or one on the wrong axis, is reported
naming the node.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto

_INT8 = (TensorProto.INT8, TensorProto.UINT8)


def float_weight_matmuls(model: onnx.ModelProto, keep_float: tuple[str, ...] = ()) -> list[str]:
    """MatMuls that still multiply by a float constant: a weight initializer, or a Transpose of
    one (how a head tied to the embedding table is exported). In an INT8 model each is a weight
    the quantizer missed, unless ``keep_float`` names it (``coinfer.quantize.int8.kept_float``)."""
    from coinfer.quantize.int8 import kept_float

    inits = {i.name: i for i in model.graph.initializer}
    transposed = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in inits}
    out = []
    for n in model.graph.node:
        if n.op_type != "MatMul" or len(n.input) < 2 or kept_float(n, keep_float):
            continue
        w = inits.get(n.input[1]) or inits.get(transposed.get(n.input[1], ""))
        if w is not None and w.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16):
            out.append(f"{n.name or n.output[0]} (weight {w.name}{', transposed' if n.input[1] in transposed else ''})")
    return out


def _manifest_keep_float(model_path: Path) -> tuple[str, ...]:
    import json

    try:
        manifest = json.loads((model_path.parent / "manifest.json").read_text())
        return tuple(manifest.get("params", {}).get("keep_float", ()))
    except (OSError, ValueError, AttributeError):
        return ()


def quantized_weights(model_path: Path) -> list[str]:
    """Names of the quantized weight tensors (the manifest lists them)."""
    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type in ("MatMulNBits", "MatMulInteger") and node.input[1] in inits:
            out.append(node.input[1])
        elif (
            node.op_type == "DequantizeLinear"
            and node.input[0] in inits
            and inits[node.input[0]].data_type in _INT8
            and len(inits[node.input[0]].dims) == 2
        ):
            out.append(node.input[0])
    return out


def check_structure(model_path: Path, keep_float: tuple[str, ...] | None = None) -> tuple[int, list[str]]:
    """(quantized weights checked, problems). No problems = the structure is right. ``keep_float``:
    weight names (substrings) meant to stay float (``QuantConfig.keep_float``); None = what the
    model's manifest records."""
    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    if keep_float is None:
        keep_float = _manifest_keep_float(model_path)
    problems: list[str] = [
        f"MatMul {m}: weight stayed float (not quantized)" for m in float_weight_matmuls(model, keep_float)
    ]
    checked = 0
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            checked += 1
            problems += _check_nbits(node, inits)
            continue
        if node.op_type == "MatMulInteger":
            weight, zp = node.input[1], node.input[3] if len(node.input) > 3 else ""
            scale = weight.removesuffix("_quantized") + "_scale"
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            weight, scale, zp = node.input[0], node.input[1], node.input[2] if len(node.input) > 2 else ""
        else:
            continue
        w = inits.get(weight)
        if w is None:
            continue  # an activation, not a weight
        checked += 1
        where = f"{node.op_type} {node.name or weight}"
        if w.data_type not in _INT8:
            problems.append(f"{where}: weight {weight} is {TensorProto.DataType.Name(w.data_type)}, not int8/uint8")
        out_channels = w.dims[-1] if len(w.dims) == 2 else None  # MatMul B is [K, N]: N outputs
        if node.op_type == "DequantizeLinear":
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            if len(w.dims) == 2 and axis not in (1, -1):
                problems.append(f"{where}: axis {axis}, expected 1 (the output channels of a [K, N] weight)")
        s = inits.get(scale)
        if s is None:
            problems.append(f"{where}: no scale initializer {scale}")
        else:
            if s.data_type != TensorProto.FLOAT:
                problems.append(f"{where}: scale {scale} is {TensorProto.DataType.Name(s.data_type)}, not float32")
            if len(s.dims) != 1 or (out_channels is not None and s.dims[0] != out_channels):
                problems.append(
                    f"{where}: scale {scale} has shape {list(s.dims)}, expected [{out_channels}] "
                    "(per-channel on the output axis)"
                )
        z = inits.get(zp)
        if z is None:
            problems.append(f"{where}: no zero point initializer")
        else:
            if z.data_type not in _INT8:
                problems.append(f"{where}: zero point {zp} is {TensorProto.DataType.Name(z.data_type)}, not int8/uint8")
            if len(z.dims) != 1 or (out_channels is not None and z.dims[0] != out_channels):
                problems.append(f"{where}: zero point {zp} has shape {list(z.dims)}, expected [{out_channels}]")
    if checked == 0:
        problems.append("no quantized MatMul weights found: not an INT8 model")
    return checked, problems


def _check_nbits(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> list[str]:
    attrs = {a.name: a.i for a in node.attribute}
    where = f"MatMulNBits {node.name}"
    n, k, bits, block = attrs.get("N", 0), attrs.get("K", 0), attrs.get("bits", 4), attrs.get("block_size", 0)
    problems = []
    if bits != 8:
        problems.append(f"{where}: {bits}-bit weights, expected 8")
    blocks = -(-k // block) if block else 0
    w, s = inits.get(node.input[1]), inits.get(node.input[2])
    if w is None or w.data_type != TensorProto.UINT8:
        problems.append(f"{where}: packed weight {node.input[1]} missing or not uint8")
    if s is None:
        problems.append(f"{where}: no scale initializer {node.input[2]}")
        return problems
    if s.data_type != TensorProto.FLOAT:
        problems.append(f"{where}: scale {s.name} is {TensorProto.DataType.Name(s.data_type)}, not float32")
    numel = 1
    for d in s.dims:
        numel *= d
    if numel != n * blocks or (s.dims and s.dims[0] != n):
        problems.append(
            f"{where}: scale {s.name} has shape {list(s.dims)}, expected [{n}, {blocks}] "
            "(per output channel and K-block)"
        )
    z = inits.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    if z is None:
        problems.append(f"{where}: no zero point initializer")
    elif z.data_type not in _INT8:
        problems.append(f"{where}: zero point {z.name} is {TensorProto.DataType.Name(z.data_type)}, not int8/uint8")
    elif not z.dims or z.dims[0] != n:
        problems.append(f"{where}: zero point {z.name} has shape {list(z.dims)}, expected [{n}, ...]")
    return problems
