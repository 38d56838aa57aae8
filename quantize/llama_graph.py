"""An export-friendly Llama forward pass with an explicit KV cache.

Mirrors ``transformers.LlamaForCausalLM`` numerically (RMSNorm, rotary
embeddings with ``rope_theta``, SwiGLU MLP, grouped-query attention) but takes
and returns the cache as plain tensors, so one ONNX graph serves prefill
(past length 0) and decode (past length P). Written out rather than wrapping
the HF module because the HF cache classes change shape between transformers
releases, and the exported graph must not.

Input / output names follow Optimum's ``text-generation-with-past`` export,
so an ``optimum-cli``-exported model runs on the same edge runtime:

    input_ids        int64 [B, T]
    attention_mask   int64 [B, P+T]   1 = attend, 0 = padding
    position_ids     int64 [B, T]
    past_key_values.{i}.key / .value   float [B, H_kv, P, D]
 -> logits           float [B, 1, V]   the last position only (default; [B, T, V] with all_logits)
    present.{i}.key / .value           float [B, H_kv, P+T, D]

Only the last position's logits by default: sampling needs nothing else, and the LM head over
every prompt position is the largest tensor of a prefill (a 2k-token prompt at a 128k
vocabulary is ~1 GB of float32 logits). Runtimes that take ``logits[:, -1]`` (ours, Optimum's
generation loop) read both layouts the same way.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaForCausalLM

STATIC_ROPE = ("llama3", "linear", "yarn")
"""RoPE scalings whose frequencies are fixed by the config (exported as constants)."""


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order."""
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(var + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ExportLlama(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *past) -> (logits, *present)``."""

    def __init__(self, hf: LlamaForCausalLM, all_logits: bool = False) -> None:
        super().__init__()
        self.all_logits = all_logits
        cfg = hf.config
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type")) or "default"
        self.rope_scale = 1.0
        if rope_type == "default":
            inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        elif rope_type in STATIC_ROPE:
            # transformers' own frequency tables (Llama 3's band-wise scaling, linear, YaRN): they depend on
            # the config only, never on the sequence length, so one exported graph holds them exactly
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, self.rope_scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, torch.device("cpu"))
            inv_freq = inv_freq.to(torch.float32)
        else:
            raise ValueError(f"unsupported rope_type {rope_type!r} (supported: default, {', '.join(STATIC_ROPE)}; "
                             "dynamic / longrope scaling depends on the sequence length)")
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.model = hf.model
        self.lm_head = hf.lm_head
        if self.lm_head.weight is self.model.embed_tokens.weight:
            # Tied embeddings: exported as they are, the head is MatMul(Transpose(table)), which no
            # quantizer takes as a constant weight, so it would stay float32 -- about half of
            # each decode step's bytes at a real vocabulary. The head gets its own copy: the table
            # (a Gather, stored fp16) and the head (quantized per channel) then shrink apart.
            head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            head.weight = nn.Parameter(self.lm_head.weight.detach().clone(), requires_grad=False)
            self.lm_head = head

    def _attn(self, layer: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              mask: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        a = layer.self_attn
        q = a.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D] (Qwen2: with bias)
        k = a.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        if hasattr(a, "q_norm"):  # Qwen3: RMSNorm over each head's dimension before the rotation
            q = _rms_norm(q, a.q_norm.weight, self.eps)
            k = _rms_norm(k, a.k_norm.weight, self.eps)
        v = a.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = torch.cat([pk, k], dim=2)  # [B, Hkv, P+T, D]
        v = torch.cat([pv, v], dim=2)
        rep = self.num_heads // self.num_kv_heads
        kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        vv = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        scores = torch.matmul(q, kk.transpose(2, 3)) * (self.head_dim**-0.5)  # [B, H, T, P+T]
        # finite fill, not -inf: a fully padded query row must give zeros, not NaN
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(torch.softmax(scores, dim=-1), vv)  # [B, H, T, D]
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return a.o_proj(out), k, v

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = input_ids.shape[1]
        total = attention_mask.shape[1]
        x = self.model.embed_tokens(input_ids)
        freqs = position_ids[..., None].to(torch.float32) * self.inv_freq  # [B, T, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, T, D]
        cos, sin = (emb.cos() * self.rope_scale).to(x.dtype), (emb.sin() * self.rope_scale).to(x.dtype)
        # query i sits at absolute slot total-t+i; it may see key j <= that slot, if unpadded
        q_slot = torch.arange(t, device=x.device) + (total - t)
        k_slot = torch.arange(total, device=x.device)
        causal = k_slot[None, :] <= q_slot[:, None]  # [T, P+T]
        mask = causal[None, None] & attention_mask[:, None, None, :].bool()  # [B, 1, T, P+T]
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            h, k, v = self._attn(layer, _rms_norm(x, layer.input_layernorm.weight, self.eps), cos, sin, mask,
                                 past[2 * i], past[2 * i + 1])
            x = x + h
            m = layer.mlp
            hn = _rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
            x = x + m.down_proj(nn.functional.silu(m.gate_proj(hn)) * m.up_proj(hn))
            presents += [k, v]
        if not self.all_logits:
            x = x[:, -1:]  # [B, 1, hidden]: the LM head runs on the last position only
        logits = self.lm_head(_rms_norm(x, self.model.norm.weight, self.eps))
        return (logits, *presents)
