"""An export-friendly decoder forward pass with an explicit KV cache, for the families users deploy.

Mirrors the transformers module of each family numerically, calling its own submodules (norms,
projections, activations, the scaled embedding) and restating only what the HF cache classes
hide: rotary position, attention with its masks, and the cache itself, taken and returned as
plain tensors so one ONNX graph serves prefill (past length 0) and decode (past length P). The
HF cache classes change shape between transformers releases; the exported graph must not.

What varies by family, read from the loaded module rather than from a per-family copy:

- projections: separate ``q/k/v_proj`` (Llama, Mistral, Qwen2 with bias, Qwen3, Gemma 2) or one
  fused ``qkv_proj`` (Phi-3); MLP ``gate_proj``/``up_proj`` or fused ``gate_up_proj`` (Phi-3);
- Qwen3's per-head ``q_norm`` / ``k_norm`` before the rotation;
- Gemma 2's sandwich norms (after attention, before and after the MLP), attention-logit and
  final-logit soft-capping, ``query_pre_attn_scalar`` (the module's ``scaling``) and the
  embedding scale (inside its embedding module);
- sliding-window attention per layer (Mistral, Phi-3 on every layer; Gemma 2 on alternate
  layers; Qwen2 where ``use_sliding_window``), masked exactly as transformers does
  (key j visible to query i when ``i - window < j <= i``), so no context cap is needed;
- rotary frequencies and attention scaling are the model's own ``rotary_emb`` tables (default,
  Llama 3, linear, YaRN; partial rotary as Phi-3 allows); length-dependent scalings are refused.

Input / output names follow Optimum's ``text-generation-with-past`` export,
so an ``optimum-cli``-exported model runs on the same edge runtime:

    input_ids        int64 [B, T]
    attention_mask   int64 [B, P+T]   1 = attend, 0 = padding
    position_ids     int64 [B, T]
    past_key_values.{i}.key / .value   float [B, H_kv, P, D]
 -> logits           float [B, 1, V]   the last position only (default; [B, T, V] with all_logits)
    present.{i}.key / .value           float [B, H_kv, P+T, D]

With ``kv_cache="buffer"`` each layer's attention is ONNX Runtime's GroupQueryAttention
(``quantize/gqa_op.py``), same names: the cache inputs may then be fixed-capacity buffers that the
runtime binds as outputs too, so no step concatenates or copies the cache.

Only the last position's logits by default: sampling needs nothing else, and the LM head over
every prompt position is the largest tensor of a prefill (a 2k-token prompt at a 128k
vocabulary is ~1 GB of float32 logits). Runtimes that take ``logits[:, -1]`` (ours, Optimum's
generation loop) read both layouts the same way.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

STATIC_ROPE = ("llama3", "linear", "yarn")
KV_CACHES = ("concat", "buffer")
"""RoPE scalings whose frequencies are fixed by the config (exported as constants)."""


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order."""
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def rope_type(cfg) -> str:
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return rope.get("rope_type", rope.get("type")) or "default"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of each head (all of them unless partial rotary)."""
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rot, keep = x[..., :d], x[..., d:]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, keep), dim=-1)


def _soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if not cap else torch.tanh(x / cap) * cap


def _window(cfg, attn: nn.Module) -> int | None:
    """The layer's sliding window, as its transformers module applies it (None = full attention)."""
    if hasattr(attn, "sliding_window"):  # per layer: Gemma 2, Qwen2/3 (layer_types)
        return attn.sliding_window
    return getattr(cfg, "sliding_window", None)  # every layer: Mistral, Phi-3


class ExportDecoder(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *past) -> (logits, *present)``."""

    def __init__(self, hf: PreTrainedModel, all_logits: bool = False, kv_cache: str = "concat") -> None:
        super().__init__()
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache: unknown {kv_cache!r} (known: {', '.join(KV_CACHES)})")
        self.all_logits = all_logits
        self.kv_cache = kv_cache
        cfg = hf.config
        if rope_type(cfg) not in ("default", *STATIC_ROPE):
            raise ValueError(f"unsupported rope_type {rope_type(cfg)!r} (supported: default, {', '.join(STATIC_ROPE)}; "
                             "dynamic / longrope scaling depends on the sequence length)")
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.attn_cap = getattr(cfg, "attn_logit_softcapping", None)
        self.final_cap = getattr(cfg, "final_logit_softcapping", None)
        self.config = cfg
        self.model = hf.model
        self.windows = [_window(cfg, layer.self_attn) for layer in self.model.layers]
        # the model's own rotary tables: for static scalings they depend on the config only, never on
        # the sequence length, so one exported graph holds them exactly
        rotary = self.model.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().to(torch.float32).clone(), persistent=False)
        self.rope_scale = float(rotary.attention_scaling)
        self.lm_head = hf.lm_head
        if self.lm_head.weight is self.model.embed_tokens.weight:
            # Tied embeddings: exported as they are, the head is MatMul(Transpose(table)), which no
            # quantizer takes as a constant weight, so it would stay float32 -- about half of
            # each decode step's bytes at a real vocabulary. The head gets its own copy: the table
            # (a Gather, stored fp16) and the head (quantized per channel) then shrink apart.
            head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            head.weight = nn.Parameter(self.lm_head.weight.detach().clone(), requires_grad=False)
            self.lm_head = head

    def _qkv(self, a: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if hasattr(a, "qkv_proj"):  # Phi-3: one fused projection, split [q | k | v]
            qkv = a.qkv_proj(x)
            nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            return qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]
        return a.q_proj(x), a.k_proj(x), a.v_proj(x)  # Qwen2: with bias

    def _attn(self, layer: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              mask: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        a = layer.self_attn
        q, k, v = self._qkv(a, x)
        q = q.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = k.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(a, "q_norm"):  # Qwen3: RMSNorm over each head's dimension before the rotation
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.kv_cache == "buffer":  # one GroupQueryAttention node: the cache may be a buffer written in place
            from quantize import gqa_op  # noqa: F401 - registers torch.ops.coinfer.gqa

            seqlens, total = mask
            out, k, v = torch.ops.coinfer.gqa(
                q.transpose(1, 2).reshape(b, t, -1), k.transpose(1, 2).reshape(b, t, -1),
                v.transpose(1, 2).reshape(b, t, -1), pk, pv, seqlens, total, self.num_heads, self.num_kv_heads,
                float(a.scaling), int(_window(self.config, a) or 0), float(self.attn_cap or 0.0))
            return a.o_proj(out), k, v
        k = torch.cat([pk, k], dim=2)  # [B, Hkv, P+T, D]
        v = torch.cat([pv, v], dim=2)
        rep = self.num_heads // self.num_kv_heads
        kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        vv = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        scores = _soft_cap(torch.matmul(q, kk.transpose(2, 3)) * a.scaling, self.attn_cap)  # [B, H, T, P+T]
        # finite fill, not -inf: a fully padded query row must give zeros, not NaN
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(torch.softmax(scores, dim=-1), vv)  # [B, H, T, D]
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return a.o_proj(out), k, v

    @staticmethod
    def _mlp(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if hasattr(m, "gate_up_proj"):  # Phi-3: [gate | up] in one projection
            gate, up = m.gate_up_proj(x).chunk(2, dim=-1)
            return m.down_proj(m.activation_fn(gate) * up)
        return m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x))  # SiLU, or Gemma's tanh GELU

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = input_ids.shape[1]
        total = attention_mask.shape[1]
        x = self.model.embed_tokens(input_ids)  # Gemma's module scales by sqrt(hidden) itself
        freqs = position_ids[..., None].to(torch.float32) * self.inv_freq  # [B, T, R/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, R]
        cos, sin = (emb.cos() * self.rope_scale).to(x.dtype), (emb.sin() * self.rope_scale).to(x.dtype)
        # query i sits at absolute slot total-t+i; it may see key j <= that slot, if unpadded
        q_slot = torch.arange(t, device=x.device) + (total - t)
        k_slot = torch.arange(total, device=x.device)
        causal = k_slot[None, :] <= q_slot[:, None]  # [T, P+T]
        padding = attention_mask[:, None, None, :].bool()
        masks = {}
        for w in set(self.windows):
            seen = causal if w is None else causal & (k_slot[None, :] > q_slot[:, None] - w)
            masks[w] = seen[None, None] & padding  # [B, 1, T, P+T]
        if self.kv_cache == "buffer":  # the node masks itself from per-row lengths and the total length
            lengths = (attention_mask.sum(-1) - 1).to(torch.int32)
            total = torch.ones_like(attention_mask[0]).sum().to(torch.int32)  # P+T as a scalar tensor
            masks = {w: (lengths, total) for w in masks}
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            h, k, v = self._attn(layer, layer.input_layernorm(x), cos, sin, masks[self.windows[i]],
                                 past[2 * i], past[2 * i + 1])
            if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 2: norms around both blocks
                x = x + layer.post_attention_layernorm(h)
                x = x + layer.post_feedforward_layernorm(self._mlp(layer.mlp, layer.pre_feedforward_layernorm(x)))
            else:
                x = x + h
                x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x))
            presents += [k, v]
        if not self.all_logits:
            x = x[:, -1:]  # [B, 1, hidden]: the LM head runs on the last position only
        logits = _soft_cap(self.lm_head(self.model.norm(x)), self.final_cap)
        return (logits, *presents)
