"""transformers' Llama forward (5.19, SDPA attention), op for op, without its per-call overhead.

On the CPU a decode step of the bundled draft (2.85 M parameters, batch 8) is almost all
framework overhead: through ``LlamaForCausalLM.__call__`` it took ~7.5 ms, of which the
matrix products were ~2.5 ms; the rest was module dispatch, output capturing, the 4-D mask
factory and the dynamic cache's concatenations. This module runs the same tensor
operations in the same order with the same arguments (so the same kernels see the same
inputs and give the same bits; ``tests/service/engines/local/test_eager_llama.py`` checks
logits for equality, not closeness) and appends keys and values in place
(:class:`service.engines.local.cache.GrowingLayer`).

What it mirrors, per call with S inputs over a cache of P columns and a 2-D mask [B, P + S]:
the mask is skipped (``attn_mask=None``) when every entry is 1 and S == 1 or P == 0 (then
``is_causal = S > 1`` and grouped-query attention runs inside SDPA); otherwise it is the
boolean [B, 1, S, P + S] ``kv <= P + q and mask[b, kv]`` (transformers'
``create_causal_mask`` and ``sdpa_attention_forward``, which then repeats the key/value heads;
here SDPA's grouped-query attention reads them in place, with the same bits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from service.engines.local.cache import GrowingCache


def supports(model) -> bool:
    """Whether ``model`` is a Llama this forward mirrors (default RoPE, SDPA, no biases)."""
    c = model.config
    rope = getattr(c, "rope_parameters", None) or {}
    return (c.model_type == "llama" and type(model).__name__ == "LlamaForCausalLM"
            and rope.get("rope_type", "default") == "default"
            and getattr(c, "_attn_implementation", "sdpa") == "sdpa"
            and not c.attention_bias and not c.mlp_bias and getattr(c, "pretraining_tp", 1) == 1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # LlamaRMSNorm.forward
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Output projections of at least this many rows go through oneDNN's prepacked weights
# (where they give MKL's bits, checked at start): for the bundled draft's head (8,192 x 192) at
# 8 rows, 0.4 ms instead of 0.55-1.4 ms. Below 4 rows MKL takes another path whose rounding
# oneDNN does not reproduce, so those stay with F.linear (transformers' own product).
_PACKED_MIN_ROWS = 4
_CHECK_ROWS = (4, 5, 8, 13, 16, 40)


class Head:
    """The output projection (``lm_head``): F.linear, or the same product through oneDNN's
    prepacked weight for ``_PACKED_MIN_ROWS`` rows or more where that gives identical bits on
    this machine (checked once on random inputs; otherwise F.linear throughout)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.packed = None
        if not torch.backends.mkldnn.is_available():
            return
        try:
            with torch.inference_mode():
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
                g = torch.Generator().manual_seed(0)
                for rows in _CHECK_ROWS:
                    x = torch.randn((rows, weight.shape[1]), generator=g, dtype=weight.dtype) * 3
                    if not torch.equal(self._packed(x, packed), F.linear(x, weight)):
                        return
        except (AttributeError, RuntimeError):  # a torch without these oneDNN ops
            return
        self.packed = packed

    @staticmethod
    def _packed(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.packed is None or rows < _PACKED_MIN_ROWS:
            return F.linear(x, self.weight)
        return self._packed(x.reshape(rows, x.shape[-1]), self.packed).view(*x.shape[:-1], -1)


@torch.inference_mode()
def forward(model, cache: GrowingCache, input_ids: torch.Tensor, mask: torch.Tensor,
            positions: torch.Tensor, head: Head | None = None) -> torch.Tensor:
    """input_ids, positions [B, S] int64 and the 2-D mask [B, P + S] (1 = attend; P = the
    cache's columns) -> logits [B, S, V] in the model's dtype. Appends this call's S columns
    to ``cache``. ``head``: the output projection (default F.linear with ``lm_head``).
    Every position's logits are computed, also where only the last is used: the product's
    rounding depends on the row count (one row gives other bits than the same row among
    several), and the texts must be those of transformers' forward."""
    config = model.config
    inner = model.model
    batch, seq = input_ids.shape
    past = cache.columns()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    groups = config.num_attention_heads // config.num_key_value_heads
    eps = config.rms_norm_eps

    x = F.embedding(input_ids, inner.embed_tokens.weight, inner.embed_tokens.padding_idx)
    # LlamaRotaryEmbedding.forward (default RoPE: attention_scaling is 1.0, a no-op multiply)
    rotary = inner.rotary_emb
    freqs = positions[..., None].float() * rotary.inv_freq.to(device=x.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if rotary.attention_scaling != 1.0:
        cos, sin = cos * rotary.attention_scaling, sin * rotary.attention_scaling
    cos, sin = cos.to(x.dtype).unsqueeze(1), sin.to(x.dtype).unsqueeze(1)

    # create_causal_mask: skipped when it would be a plain causal mask.
    full = bool(mask.all())
    if full and (seq == 1 or past == 0):
        attn_mask, is_causal = None, seq > 1
    else:
        padding = mask.to(dtype=torch.bool)
        q_idx = torch.arange(seq, device=x.device) + past
        kv_idx = torch.arange(past + seq, device=x.device)
        attn_mask = (kv_idx[None, None, None, :] <= q_idx[None, None, :, None]) & padding[:, None, None, :]
        attn_mask = attn_mask.expand(batch, -1, seq, past + seq)
        is_causal = False

    hidden_shape = (batch, seq, -1, head_dim)
    for i, layer in enumerate(inner.layers):
        attn = layer.self_attn
        residual = x
        h = _rms_norm(x, layer.input_layernorm.weight, eps)
        q = F.linear(h, attn.q_proj.weight).view(hidden_shape).transpose(1, 2)
        k = F.linear(h, attn.k_proj.weight).view(hidden_shape).transpose(1, 2)
        v = F.linear(h, attn.v_proj.weight).view(hidden_shape).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        keys, values = cache.layers[i].append(k, v)
        # With a mask transformers repeats the key/value heads (repeat_kv) first; SDPA's own
        # grouped-query path gives the same bits without the copies (test_eager_llama).
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, dropout_p=0.0, scale=attn.scaling,
                                             is_causal=is_causal, enable_gqa=groups > 1)
        out = out.transpose(1, 2).contiguous().reshape(batch, seq, -1).contiguous()
        x = residual + F.linear(out, attn.o_proj.weight)
        residual = x
        h = _rms_norm(x, layer.post_attention_layernorm.weight, eps)
        mlp = layer.mlp
        h = F.linear(mlp.act_fn(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                     mlp.down_proj.weight)
        x = residual + h
    x = _rms_norm(x, inner.norm.weight, eps)
    return F.linear(x, model.lm_head.weight) if head is None else head(x)
