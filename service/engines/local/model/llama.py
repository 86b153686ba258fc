"""Llama (the bundled draft) over a StaticCache: transformers' LlamaForCausalLM math
(RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU MLP) with fixed shapes."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rope(positions: torch.Tensor, inv_freq: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, S] -> cos, sin [B, S, 2 * len(inv_freq)] (transformers' layout)."""
    freqs = positions.unsqueeze(-1).float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """A transformers RMSNorm module (Llama's, DeepSeek's: weight * x / rms(x)) applied as
    ``F.rms_norm`` on CUDA: one fused kernel where the module's float32 round trip takes
    eight launches (about a fifth of a speculative block's kernels). Elsewhere, and for any
    other norm, the module itself (the CPU path and its equality tests are unchanged)."""
    eps = getattr(norm, "variance_epsilon", None)
    if not x.is_cuda or eps is None or not type(norm).__name__.endswith("RMSNorm"):
        return norm(x)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(model, cache, input_ids, positions, columns, mask, bound) -> torch.Tensor:
    from service.engines.local.model.attention import attention

    c = model.config
    inner = model.model
    batch, seq = input_ids.shape
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    x = inner.embed_tokens(input_ids)
    cos, sin = rope(positions, inner.rotary_emb.inv_freq, x.dtype)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, S, 1, D]
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        h = rms_norm(layer.input_layernorm, x)
        q = attn.q_proj(h).view(batch, seq, heads, head_dim)
        k = attn.k_proj(h).view(batch, seq, kv_heads, head_dim)
        v = attn.v_proj(h).view(batch, seq, kv_heads, head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys = cache.write(i, "k", columns, k.reshape(batch, seq, -1)).view(batch, -1, kv_heads, head_dim)
        values = cache.write(i, "v", columns, v.reshape(batch, seq, -1)).view(batch, -1, kv_heads, head_dim)
        out = attention(q, keys, values, mask, bound, attn.scaling)  # [B, S, H, D] float32, batch-invariant
        x = x + attn.o_proj(out.reshape(batch, seq, -1).to(x.dtype))
        x = x + layer.mlp(rms_norm(layer.post_attention_layernorm, x))
    return model.lm_head(rms_norm(inner.norm, x))
