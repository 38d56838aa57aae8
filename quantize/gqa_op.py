"""Attention over a preallocated KV buffer: ONNX Runtime's ``com.microsoft.GroupQueryAttention``.

The default export concatenates each step's keys and values onto the cache inside the graph
(Optimum's layout): every decode step copies the whole cache into a new, longer tensor. With
``--kv-cache buffer`` each layer's attention is one GroupQueryAttention node instead. Its cache
input may be a buffer of fixed capacity that the runtime binds as the node's output too
(``past_present_share_buffer``): the step writes its new keys and values in place at the current
length, and nothing is copied or reallocated per step (``coinfer.edge.onnx_lm``, IO binding, CPU and CUDA).

Fed a cache of length P instead (no binding), the same node returns one of length P + T, like the
concatenating graph, so calibration, gates and parity run unchanged. The graph's inputs and outputs
keep Optimum's names: the node's per-row lengths come from ``attention_mask`` inside the graph.

Here: a torch custom op (a reference implementation for eager runs, a fake one for tracing) and its
translation to the ONNX Runtime contrib op for ``torch.onnx.export(custom_translation_table=...)``.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("coinfer::gqa", mutates_args=())
def gqa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    past_key: torch.Tensor,
    past_value: torch.Tensor,
    seqlens_k: torch.Tensor,
    total_len: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query [B, T, H*D], key / value [B, T, Hkv*D] (rotary applied), past [B, Hkv, P, D] ->
    (out [B, T, H*D], present key, present value [B, Hkv, P+T, D]); causal, no padding; ``window``
    <= 0 = global; ``softcap`` 0 = none."""
    b, t, _ = query.shape
    d = past_key.shape[-1]
    q = query.view(b, t, num_heads, d).transpose(1, 2)
    k = torch.cat([past_key, key.view(b, t, kv_num_heads, d).transpose(1, 2)], dim=2)
    v = torch.cat([past_value, value.view(b, t, kv_num_heads, d).transpose(1, 2)], dim=2)
    rep = num_heads // kv_num_heads
    scores = torch.matmul(q, k.repeat_interleave(rep, 1).transpose(2, 3)) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    total = k.shape[2]
    q_slot = torch.arange(t)[:, None] + (total - t)
    k_slot = torch.arange(total)[None, :]
    seen = k_slot <= q_slot
    if window > 0:
        seen = seen & (k_slot > q_slot - window)
    scores = scores.masked_fill(~seen, torch.finfo(scores.dtype).min)
    out = torch.matmul(torch.softmax(scores, -1), v.repeat_interleave(rep, 1))
    return out.transpose(1, 2).reshape(b, t, num_heads * d), k, v


@gqa.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_len, num_heads, kv_num_heads, scale, window, softcap):
    b, t, _ = query.shape
    present = past_key.new_empty((b, past_key.shape[1], past_key.shape[2] + t, past_key.shape[3]))
    return query.new_empty(query.shape), present, torch.empty_like(present)


def register_schema() -> None:
    """Tell onnx (the exporter's builder, the checker) what the ONNX Runtime contrib op takes: the subset
    we use of its inputs and attributes (the runtime itself checks the node when it loads it)."""
    import onnx
    from onnx.defs import OpSchema

    if onnx.defs.has("GroupQueryAttention", "com.microsoft"):
        return
    p, a = OpSchema.FormalParameter, OpSchema.Attribute
    ins = ["query", "key", "value", "past_key", "past_value"]
    onnx.defs.register_schema(
        OpSchema(
            "GroupQueryAttention",
            "com.microsoft",
            1,
            doc="ONNX Runtime contrib op (subset declared for export)",
            inputs=[p(n, "T") for n in ins] + [p("seqlens_k", "M"), p("total_sequence_length", "M")],
            outputs=[p("output", "T"), p("present_key", "T"), p("present_value", "T")],
            type_constraints=[
                ("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "float"),
                ("M", ["tensor(int32)"], "lengths"),
            ],
            attributes=[
                a("num_heads", OpSchema.AttrType.INT, "", required=True),
                a("kv_num_heads", OpSchema.AttrType.INT, "", required=True),
                a("scale", OpSchema.AttrType.FLOAT, "", required=False),
                a("local_window_size", OpSchema.AttrType.INT, "", required=False),
                a("softcap", OpSchema.AttrType.FLOAT, "", required=False),
            ],
        )
    )


def translation_table() -> dict:
    """{torch op: onnxscript function} for ``torch.onnx.export``."""
    import onnxscript

    register_schema()
    msft = onnxscript.values.Opset("com.microsoft", 1)
    node = msft.GroupQueryAttention

    def gqa_onnx(
        query,
        key,
        value,
        past_key,
        past_value,
        seqlens_k,
        total_len,
        num_heads: int,
        kv_num_heads: int,
        scale: float,
        window: int,
        softcap: float,
    ):
        # HF's window admits keys j with i - window < j <= i, which the node's local_window_size = window
        # reproduces (export parity past the window on Mistral, Phi-3 and Gemma 2 models: 1e-6 logits)
        return node(
            query,
            key,
            value,
            past_key,
            past_value,
            seqlens_k,
            total_len,
            num_heads=num_heads,
            kv_num_heads=kv_num_heads,
            scale=scale,
            local_window_size=window if window > 0 else -1,
            softcap=softcap,
            _outputs=3,
        )

    return {torch.ops.coinfer.gqa.default: gqa_onnx}
