"""An export-friendly decoder forward pass with an explicit KV cache, for the families users deploy.

Mirrors the transformers module of each family numerically, calling its own submodules (norms,
projections, activations, the scaled embedding) and restating only what the HF cache classes
hide: rotary position, attention with its masks, and the cache itself, taken and returned as
plain tensors so one ONNX graph serves prefill (past length 0) and decode (past length P). The
HF cache classes change shape between transformers releases; the exported graph must not.

What varies by family, read from the loaded module rather than from a per-family copy:

- projections: separate ``q/k/v_proj`` (Llama, Mistral, Qwen2 with bias, Qwen3, Gemma 2/3) or one
  fused ``qkv_proj`` (Phi-3); MLP ``gate_proj``/``up_proj`` or fused ``gate_up_proj`` (Phi-3);
- per-head ``q_norm`` / ``k_norm`` before the rotation (Qwen3; Gemma 3's ``(1 + w)`` form);
- Gemma 2/3's sandwich norms (after attention, before and after the MLP), final-logit soft-capping
  where the config sets it (attention-logit soft-capping Gemma 2's only), ``query_pre_attn_scalar`` (the module's
  ``scaling``) and the embedding scale (inside its embedding module, in the model's dtype);
- sliding-window attention per layer (Mistral, Phi-3 on every layer; Gemma 2 on alternate
  layers, Gemma 3 on five of every six; Qwen2 where ``use_sliding_window``), masked exactly as
  transformers does (key j visible to query i when ``i - window < j <= i``) over the whole
  cache, so no context cap is needed (see "Sliding windows" below);
- rotary frequencies and attention scaling are the model's own ``rotary_emb`` tables (default,
  Llama 3, linear, YaRN; partial rotary as Phi-3 allows), one per layer type where the model has
  several (Gemma 3: local layers at ``rope_local_base_freq``, global ones at ``rope_theta`` with
  the config's scaling); length-dependent scalings are refused.

Sliding windows, in both graphs, are a mask over a cache that keeps every position, not a ring
buffer of ``window`` slots. The cache layout is then one for every layer and every family: one
``[B, H_kv, P, D]`` tensor per layer whose slot is the position, which is what the edge runtime
preallocates (one capacity and one length for all layers, ``edge.onnx_lm.Buffers``), what
GroupQueryAttention writes in place at ``seqlens_k`` (its ``local_window_size`` then attends the
last ``window`` keys only, so a local layer's step costs the window, not the context), and what a
draft rolled back to a shorter prefix needs (truncate the length; a ring would have overwritten the
positions it returns to). A ring would save the local layers' cache beyond the window (Gemma 3
270M: 15 of 18 layers, 1 KV head of 256: 30 KB a position) at the price of per-layer capacities and
a write index the node does not take.

Input / output names follow Optimum's ``text-generation-with-past`` export,
so an ``optimum-cli``-exported model runs on the same edge runtime:

    input_ids        int64 [B, T]
    attention_mask   int64 [B, P+T]   1 = attend, 0 = padding
    position_ids     int64 [B, T]
    past_key_values.{i}.key / .value   float [B, H_kv, P, D]
 -> logits           float [B, 1, V]   the last position only (default; [B, T, V] with all_logits)
    present.{i}.key / .value           float [B, H_kv, P+T, D]

With ``kv_cache="buffer"`` the graph is ONNX Runtime's own, same names: each layer's attention is
its GroupQueryAttention (``quantize/gqa_op.py``), whose cache inputs may be fixed-capacity buffers
the runtime binds as outputs too, so no step concatenates or copies the cache; and, since a decode
step of a small model is mostly per-node dispatch, the layer is written in as few nodes as its
numerics allow: the query, key and value projections as one MatMul (and gate with up), rotations
as RotaryEmbedding nodes (full-width rotary; per-head norms first, on the projection's per-head
view), each RMSNorm in the form ONNX Runtime fuses into one node (Gemma's ``(1 + w)`` folded into
a constant), and each residual sum with the RMSNorm after it as one
SkipSimplifiedLayerNormalization (``quantize/contrib_ops.py``).
Concatenated projections quantize exactly as the separate ones: per-channel scales are per row.

Only the last position's logits by default: sampling needs nothing else, and the LM head over
every prompt position is the largest tensor of a prefill (a 2k-token prompt at a 128k
vocabulary is ~1 GB of float32 logits). Runtimes that take ``logits[:, -1]`` (ours, Optimum's
generation loop) read both layouts the same way.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from coinfer.quantize.contrib_ops import tables as rotary_tables

STATIC_ROPE = ("llama3", "linear", "yarn")
"""RoPE scalings whose frequencies are fixed by the config (exported as constants)."""
KV_CACHES = ("concat", "buffer")


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) in graph order."""
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def rope_types(cfg) -> list[str]:
    """The rope type of each of the model's rotary tables (Gemma 3: one per layer type)."""
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    per_layer_type = rope and all(isinstance(v, dict) for v in rope.values())  # {layer type: parameters}
    return [r.get("rope_type", r.get("type")) or "default" for r in (rope.values() if per_layer_type else [rope])]


def refusal(cfg) -> str | None:
    """Why the export graph cannot state the model of ``cfg`` exactly; None when it can."""
    for kind in rope_types(cfg):
        if kind not in ("default", *STATIC_ROPE):
            return (
                f"rope_type {kind!r} unsupported (supported: default, {', '.join(STATIC_ROPE)}; "
                "it depends on the sequence length)"
            )
    if getattr(cfg, "use_bidirectional_attention", False):
        return "use_bidirectional_attention: not a causal LM (an embedding model's attention)"
    return None


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


def _fuse(linears: list[nn.Linear]) -> nn.Linear:
    """One projection computing ``linears`` side by side (their outputs concatenated, in order)."""
    weight = torch.cat([m.weight.detach() for m in linears], dim=0)
    biased = any(m.bias is not None for m in linears)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=biased)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if biased:
        fused.bias = nn.Parameter(
            torch.cat([m.bias.detach() if m.bias is not None else torch.zeros(m.out_features) for m in linears]),
            requires_grad=False,
        )
    return fused


def _soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if not cap else torch.tanh(x / cap) * cap


def _window(cfg, attn: nn.Module) -> int | None:
    """The layer's sliding window, as its transformers module applies it (None = full attention)."""
    if hasattr(attn, "sliding_window"):  # per layer: Gemma 2/3, Qwen2/3 (layer_types)
        return attn.sliding_window
    return getattr(cfg, "sliding_window", None)  # every layer: Mistral, Phi-3


def _rotaries(rotary: nn.Module, layer_types: list[str] | None, n: int) -> tuple[list, list[int]]:
    """([(inv_freq, attention scaling)] per distinct table, the table of each of ``n`` layers): one table
    for all layers, or one per layer type where the module keeps several (Gemma 3's
    ``sliding_attention_inv_freq`` at the local base, ``full_attention_inv_freq`` at the global one)."""
    if hasattr(rotary, "inv_freq"):
        return [(rotary.inv_freq, rotary.attention_scaling)], [0] * n
    kinds = sorted(set(layer_types[:n]))
    tables = [(getattr(rotary, f"{k}_inv_freq"), getattr(rotary, f"{k}_attention_scaling")) for k in kinds]
    return tables, [kinds.index(k) for k in layer_types[:n]]


def _rms_gamma(norm: nn.Module) -> tuple[torch.Tensor, float] | None:
    """(gamma, eps) with which ``norm`` computes ``x / sqrt(mean(x^2) + eps) * gamma``: its weight (Llama's
    RMSNorm) or ``1 + weight`` (Gemma's), told apart by evaluating the module; None for any other norm."""
    eps, w = getattr(norm, "variance_epsilon", getattr(norm, "eps", None)), getattr(norm, "weight", None)
    if eps is None or w is None or w.dim() != 1:
        return None
    x = torch.randn(3, w.numel(), generator=torch.Generator().manual_seed(0)).to(w.dtype)
    with torch.no_grad():
        ref, h = norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        for gamma in (w.detach(), 1.0 + w.detach()):
            if torch.allclose(h * gamma, ref, rtol=1e-5, atol=1e-6):
                return gamma.clone(), float(eps)
    return None


class ExportDecoder(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *past) -> (logits, *present)``."""

    def __init__(self, hf: PreTrainedModel, all_logits: bool = False, kv_cache: str = "concat") -> None:
        super().__init__()
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache: unknown {kv_cache!r} (known: {', '.join(KV_CACHES)})")
        self.all_logits = all_logits
        self.kv_cache = kv_cache
        cfg = hf.config
        if why := refusal(cfg):
            raise ValueError(why)
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        # Gemma 3 keeps Gemma 2's attention soft-capping field, but its attention never applies it (not in
        # transformers, vLLM or llama.cpp: the per-head q/k norms took its place); its final-logit cap stays
        gemma3 = cfg.model_type.startswith("gemma3")
        self.attn_cap = None if gemma3 else getattr(cfg, "attn_logit_softcapping", None)
        self.final_cap = getattr(cfg, "final_logit_softcapping", None)
        self.config = cfg
        self.model = hf.model
        self.windows = [_window(cfg, layer.self_attn) for layer in self.model.layers]
        # the model's own rotary tables: for static scalings they depend on the config only, never on
        # the sequence length, so one exported graph holds them exactly
        tables, self.layer_rope = _rotaries(self.model.rotary_emb, getattr(cfg, "layer_types", None), self.num_layers)
        for j, (inv_freq, _) in enumerate(tables):
            self.register_buffer(f"inv_freq_{j}", inv_freq.detach().to(torch.float32).clone(), persistent=False)
        self.rope_scales = [float(scale) for _, scale in tables]
        self.lm_head = hf.lm_head
        if self.lm_head.weight is self.model.embed_tokens.weight:
            # Tied embeddings: exported as they are, the head is MatMul(Transpose(table)), which no
            # quantizer takes as a constant weight, so it would stay float32 -- about half of
            # each decode step's bytes at a real vocabulary. The head gets its own copy: the table
            # (a Gather, stored fp16) and the head (quantized per channel) then shrink apart.
            head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            head.weight = nn.Parameter(self.lm_head.weight.detach().clone(), requires_grad=False)
            self.lm_head = head
        if kv_cache == "buffer":
            self._fuse_for_runtime()

    def _fuse_for_runtime(self) -> None:
        """The buffer graph's fused projections and rotary tables (see the module docstring). The
        concatenated weights are copies: the export holds a model's projections twice while it runs
        (the source model is also parity's reference)."""
        attn = [layer.self_attn for layer in self.model.layers]
        self.qkv = nn.ModuleList(
            a.qkv_proj if hasattr(a, "qkv_proj") else _fuse([a.q_proj, a.k_proj, a.v_proj]) for a in attn
        )
        self.gate_up = nn.ModuleList(
            m.gate_up_proj if hasattr(m, "gate_up_proj") else _fuse([m.gate_proj, m.up_proj])
            for m in (layer.mlp for layer in self.model.layers)
        )
        # every RMSNorm as x / rms(x) * gamma with a constant gamma (Gemma's 1 + w folded in), so ONNX
        # Runtime fuses each into one node, and a residual sum with the norm after it into one more
        # (by the norm's name under ``self.model``: traced code looks modules up by name, not identity)
        self.gammas: dict[str, tuple[str, float]] = {}
        norms = [(n, m) for n, m in self.model.named_modules() if "norm" in type(m).__name__.lower()]
        for j, (name, norm) in enumerate(norms):
            if found := _rms_gamma(norm):
                self.register_buffer(f"gamma_{j}", found[0], persistent=False)
                self.gammas[name] = (f"gamma_{j}", found[1])
        # one rotation node per projection where the rotation is the whole head (per-head norms, as
        # Qwen3's and Gemma 3's, run on the [B, T, H, D] view of the projection first)
        self.rotary_node = all(
            getattr(self, f"inv_freq_{j}").numel() * 2 == self.head_dim for j in range(len(self.rope_scales))
        )
        if self.rotary_node:
            positions = int(getattr(self.config, "max_position_embeddings", 0) or 4096)
            for j, scale in enumerate(self.rope_scales):
                cos, sin = rotary_tables(getattr(self, f"inv_freq_{j}"), scale, positions, self.lm_head.weight.dtype)
                self.register_buffer(f"cos_table_{j}", cos, persistent=False)
                self.register_buffer(f"sin_table_{j}", sin, persistent=False)

    def _norm(self, norm: str, x: torch.Tensor) -> torch.Tensor:
        """The RMSNorm named ``norm`` (under ``self.model``) of ``x``; in the buffer graph in the form ONNX Runtime fuses into one
        SimplifiedLayerNormalization (over the last axis, a head's for per-head norms)."""
        if self.kv_cache != "buffer" or norm not in self.gammas:
            return self.model.get_submodule(norm)(x)
        name, eps = self.gammas[norm]
        h = x.to(torch.float32)
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return getattr(self, name) * h.to(x.dtype)

    def _add_norm(self, norm: str, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the norm ``norm`` of ``x + delta``, ``x + delta``); the buffer graph writes an RMSNorm after a
        residual sum as one SkipSimplifiedLayerNormalization node."""
        if self.kv_cache == "buffer" and delta is not None and norm in self.gammas:
            name, eps = self.gammas[norm]
            return torch.ops.coinfer.skip_rms_norm(x, delta, getattr(self, name), eps)
        x = x if delta is None else x + delta
        return self._norm(norm, x), x

    def _qkv(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.model.layers[i].self_attn
        fused = self.qkv[i] if self.kv_cache == "buffer" else getattr(a, "qkv_proj", None)
        if fused is not None:  # Phi-3's own, or the buffer graph's: one projection, split [q | k | v]
            nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            return fused(x).split([nq, nkv, nkv], dim=-1)
        return a.q_proj(x), a.k_proj(x), a.v_proj(x)  # Qwen2: with bias

    def _attn(
        self,
        i: int,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        positions: torch.Tensor,
        mask: torch.Tensor,
        pk: torch.Tensor,
        pv: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        a = self.model.layers[i].self_attn
        q, k, v = self._qkv(i, x)
        if self.kv_cache == "buffer" and self.rotary_node:  # [B, T, H*D] from projection to attention
            if hasattr(a, "q_norm"):  # per head: over the last axis of the [B, T, H, D] view
                q = self._norm(f"layers.{i}.self_attn.q_norm", q.view(b, t, self.num_heads, -1)).reshape(b, t, -1)
                k = self._norm(f"layers.{i}.self_attn.k_norm", k.view(b, t, self.num_kv_heads, -1)).reshape(b, t, -1)
            j = self.layer_rope[i]
            cos_table, sin_table = getattr(self, f"cos_table_{j}"), getattr(self, f"sin_table_{j}")
            q = torch.ops.coinfer.rotary(q, positions, cos_table, sin_table, self.num_heads)
            k = torch.ops.coinfer.rotary(k, positions, cos_table, sin_table, self.num_kv_heads)
            return self._gqa(a, q, k, v, pk, pv, mask)
        q = q.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = k.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(a, "q_norm"):  # Qwen3, Gemma 3: RMSNorm over each head's dimension before the rotation
            q, k = self._norm(f"layers.{i}.self_attn.q_norm", q), self._norm(f"layers.{i}.self_attn.k_norm", k)
        q, k = _rope(q, *rope), _rope(k, *rope)
        if self.kv_cache == "buffer":  # one GroupQueryAttention node: the cache may be a buffer written in place
            flat = [y.transpose(1, 2).reshape(b, t, -1) for y in (q, k, v)]
            return self._gqa(a, *flat, pk, pv, mask)
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

    def _gqa(
        self, a, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, mask
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention as one GroupQueryAttention node (``q``, ``k``, ``v``: [B, T, H*D]; ``mask``: the sequence
        lengths and total length), the cache ``pk``, ``pv`` a buffer it writes in place; the output projected."""
        from coinfer.quantize import gqa_op  # noqa: F401 - registers torch.ops.coinfer.gqa

        seqlens, total = mask
        out, k, v = torch.ops.coinfer.gqa(
            q,
            k,
            v,
            pk,
            pv,
            seqlens,
            total,
            self.num_heads,
            self.num_kv_heads,
            float(a.scaling),
            int(_window(self.config, a) or 0),
            float(self.attn_cap or 0.0),
        )
        return a.o_proj(out), k, v

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        m = self.model.layers[i].mlp
        fused = self.gate_up[i] if self.kv_cache == "buffer" else getattr(m, "gate_up_proj", None)
        act = getattr(m, "act_fn", None) or m.activation_fn  # SiLU, or Gemma's tanh GELU
        if fused is not None:  # Phi-3's own, or the buffer graph's: [gate | up] in one projection
            gate, up = fused(x).chunk(2, dim=-1)
            return m.down_proj(act(gate) * up)
        return m.down_proj(act(m.gate_proj(x)) * m.up_proj(x))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        t = input_ids.shape[1]
        total = attention_mask.shape[1]
        x = self.model.embed_tokens(input_ids)  # Gemma's module scales by sqrt(hidden) itself
        ropes = []  # (cos, sin) [B, 1, T, R] of each rotary table
        for j, scale in enumerate(self.rope_scales):
            freqs = position_ids[..., None].to(torch.float32) * getattr(self, f"inv_freq_{j}")  # [B, T, R/2]
            emb = torch.cat([freqs, freqs], dim=-1)[:, None]
            ropes.append(((emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)))
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
        delta = None  # the last block's output, added to the residual stream by the next norm
        for i, layer in enumerate(self.model.layers):
            y, x = self._add_norm(f"layers.{i}.input_layernorm", x, delta)
            rope = ropes[self.layer_rope[i]]
            h, k, v = self._attn(i, y, rope, position_ids, masks[self.windows[i]], past[2 * i], past[2 * i + 1])
            if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 2/3: norms around both blocks
                h = self._norm(f"layers.{i}.post_attention_layernorm", h)
                y, x = self._add_norm(f"layers.{i}.pre_feedforward_layernorm", x, h)
                delta = self._norm(f"layers.{i}.post_feedforward_layernorm", self._mlp(i, y))
            else:
                y, x = self._add_norm(f"layers.{i}.post_attention_layernorm", x, h)
                delta = self._mlp(i, y)
            presents += [k, v]
        if not self.all_logits:  # [B, 1, hidden]: the LM head runs on the last position only
            x, delta = x[:, -1:], delta[:, -1:]
        logits = _soft_cap(self.lm_head(self._add_norm("norm", x, delta)[0]), self.final_cap)
        return (logits, *presents)
