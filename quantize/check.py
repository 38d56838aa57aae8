"""Structure check of an INT8 model: per-channel weights done right (000 article, 4.4).

Every quantized MatMul weight must carry float32 scales and a 1-D zero point of
length = output channels, with int8/uint8 zero points. A per-tensor (scalar)
scale or zero point, or one on the wrong axis, is reported naming the node.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto

_INT8 = (TensorProto.INT8, TensorProto.UINT8)


def check_structure(model_path: Path) -> tuple[int, list[str]]:
    """(quantized weights checked, problems). No problems = the structure is right."""
    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    problems: list[str] = []
    checked = 0
    for node in model.graph.node:
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
        s = inits.get(scale)
        if s is None:
            problems.append(f"{where}: no scale initializer {scale}")
        else:
            if s.data_type != TensorProto.FLOAT:
                problems.append(f"{where}: scale {scale} is {TensorProto.DataType.Name(s.data_type)}, not float32")
            if len(s.dims) != 1 or (out_channels is not None and s.dims[0] != out_channels):
                problems.append(f"{where}: scale {scale} has shape {list(s.dims)}, expected [{out_channels}] "
                                "(per-channel on the output axis)")
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
