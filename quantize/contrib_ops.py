"""ONNX Runtime contrib ops of the ``buffer`` export besides its attention (``gqa_op``): a decode step of
a small model is mostly per-node dispatch, so what is a dozen nodes written out is one node here.

**Rotary position**, ``com.microsoft.RotaryEmbedding``. Written out, a rotation is a dozen nodes per projection (two views, a split of the head in halves,
a negation, a concatenation, two products and a sum), and every node costs a few microseconds of
dispatch whatever its size: on a deep, narrow model (SmolLM2-135M: 30 layers, hidden 576) the
rotations of the query and the key were ~20% of an INT8 decode step's node count. The node
rotates a ``[B, T, H * D]`` projection in place of all of them, reading the angles from constant
``[max_positions, D / 2]`` cos and sin tables (the model's own frequencies, its attention scaling
folded in) at the graph's explicit ``position_ids``, so padding and positions mean what they mean
in the written-out graph.

**The residual sum and the next RMSNorm**, ``com.microsoft.SkipSimplifiedLayerNormalization``: one
node returns both ``norm(x + block)`` and ``x + block``. (ONNX Runtime fuses a plain RMSNorm written
as ``x / sqrt(mean(x^2) + eps) * w`` itself, but not the sum before it in these graphs.)

Each op: a torch custom op (the reference for eager runs, a fake for tracing) and its translation for
``torch.onnx.export(custom_translation_table=...)``; used by the ``buffer`` export (``decoder_graph``),
the graph that is ONNX Runtime's own.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("coinfer::rotary", mutates_args=())
def rotary(
    x: torch.Tensor, position_ids: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, num_heads: int
) -> torch.Tensor:
    """x [B, T, H*D], position_ids int64 [B, T], tables [P, D/2] -> x rotated (non-interleaved halves)."""
    b, t, _ = x.shape
    h = x.view(b, t, num_heads, -1)
    cos = torch.cat([cos_table[position_ids]] * 2, dim=-1)[:, :, None]  # [B, T, 1, D]
    sin = torch.cat([sin_table[position_ids]] * 2, dim=-1)[:, :, None]
    half = h.shape[-1] // 2
    rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
    return (h * cos + rotated * sin).reshape(b, t, -1)


@rotary.register_fake
def _(x, position_ids, cos_table, sin_table, num_heads):
    return torch.empty_like(x)


def tables(
    inv_freq: torch.Tensor, scale: float, positions: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) ``[positions, D/2]`` of the model's frequencies, ``scale`` (its attention scaling) folded in."""
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq.to(torch.float32)[None]
    return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)


@torch.library.custom_op("coinfer::skip_rms_norm", mutates_args=())
def skip_rms_norm(
    x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm of ``x + skip`` as Llama's module computes it, ``x + skip``)."""
    total = x + skip
    h = total.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(total.dtype), total


@skip_rms_norm.register_fake
def _(x, skip, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


def register_schemas() -> None:
    """Declare the contrib ops to onnx (the exporter's builder, the checker): the subset we use of each."""
    import onnx
    from onnx.defs import OpSchema

    p, a, floats = (
        OpSchema.FormalParameter,
        OpSchema.Attribute,
        ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"],
    )
    optional = OpSchema.FormalParameterOption.Optional  # as ONNX Runtime declares them
    schemas = [
        OpSchema(
            "RotaryEmbedding",
            "com.microsoft",
            1,
            doc="ONNX Runtime contrib op (subset declared for export)",
            inputs=[p("input", "T"), p("position_ids", "M"), p("cos_cache", "T"), p("sin_cache", "T")],
            outputs=[p("output", "T")],
            type_constraints=[("T", floats, "float"), ("M", ["tensor(int64)"], "positions")],
            attributes=[
                a("num_heads", OpSchema.AttrType.INT, "", required=False),
                a("interleaved", OpSchema.AttrType.INT, "", required=False),
            ],
        ),
        OpSchema(
            "SkipSimplifiedLayerNormalization",
            "com.microsoft",
            1,
            doc="ONNX Runtime contrib op (subset declared for export)",
            inputs=[p("input", "T"), p("skip", "T"), p("gamma", "T")],
            outputs=[
                p("output", "T"),
                p("mean", "U", param_option=optional),
                p("inv_std_var", "U", param_option=optional),
                p("input_skip_bias_sum", "T", param_option=optional),
            ],
            type_constraints=[("T", floats, "float"), ("U", ["tensor(float)"], "statistics")],
            attributes=[a("epsilon", OpSchema.AttrType.FLOAT, "", required=False)],
        ),
    ]
    for schema in schemas:
        if not onnx.defs.has(schema.name, schema.domain):
            onnx.defs.register_schema(schema)


def translation_table() -> dict:
    """{torch op: onnxscript function} for ``torch.onnx.export``."""
    import onnxscript

    register_schemas()
    msft = onnxscript.values.Opset("com.microsoft", 1)

    def rotary_onnx(x, position_ids, cos_table, sin_table, num_heads: int):
        return msft.RotaryEmbedding(x, position_ids, cos_table, sin_table, num_heads=num_heads, interleaved=0)

    def skip_rms_norm_onnx(x, skip, weight, eps: float):
        # mean and inv_std_var are named for the builder and never read (the kernel fills them cheaply)
        normed, _, _, total = msft.SkipSimplifiedLayerNormalization(x, skip, weight, epsilon=eps, _outputs=4)
        return normed, total

    return {torch.ops.coinfer.rotary.default: rotary_onnx, torch.ops.coinfer.skip_rms_norm.default: skip_rms_norm_onnx}


STATISTICS = {"SkipSimplifiedLayerNormalization": (1, 2)}
"""{contrib op: its optional outputs typed float whatever the model's dtype (the kernel's mean and
inverse deviation)}."""


def drop_unread_statistics(graph) -> int:
    """Unname the float-only statistics outputs no node or graph output reads; returns how many.

    The FP16 conversion retypes every float tensor it finds, these too, and ONNX Runtime's schema
    types them float only: left named, the converted graph fails type inference (float vs float16).
    An optional output with an empty name is not computed, which is what an unread one should be."""
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    dropped = set()
    for node in graph.node:
        for i in STATISTICS.get(node.op_type, ()) if node.domain == "com.microsoft" else ():
            if i < len(node.output) and node.output[i] and node.output[i] not in read:
                dropped.add(node.output[i])
                node.output[i] = ""
    kept = [v for v in graph.value_info if v.name not in dropped]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return len(dropped)
