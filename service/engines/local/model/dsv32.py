"""DeepSeek-V3.2-style model (the bundled target) over a StaticCache: transformers'
DeepseekV32ForCausalLM math with fixed shapes.

- MLA (DeepSeek-V3, arXiv:2405.04434): the cache holds the compressed latent and the
  rotated shared key per column; keys and values are expanded from the latent each step.
- Lightning indexer (DeepSeek-V3.2 DSA): per query, ReLU'd multi-head scores weighted per
  head; the ``index_topk`` best columns among those the query may attend to are kept, ties
  broken by column order (a stable sort, as ``service/engines/local/stable_topk.py`` does
  for transformers' indexer), so a row's selection does not depend on its batch.
- MoE: sigmoid router with group-limited top-k (DeepSeek-V3), every expert evaluated for
  every token and weighted by the (mostly zero) routing weights: no data-dependent loop,
  so the step is capturable; plus the shared experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from service.engines.local.model.llama import rms_norm, rope, rotate_half


def _rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek's interleaved-pair RoPE (transformers' apply_rotary_pos_emb_interleave)."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _indexer_select(indexer, cache, layer: int, h, q_resid, cos, sin, columns, mask) -> torch.Tensor:
    """Selected columns [B, S, T] (True = kept): the top-k of the indexer's scores among the
    columns ``mask`` [B, S, T] allows."""
    batch, seq, _ = h.shape
    rope_dim = indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(batch, seq, indexer.n_heads, indexer.head_dim)
    k = indexer.k_norm(indexer.wk(h))  # [B, S, D]
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    q_rot = q[..., :rope_dim] * c + rotate_half(q[..., :rope_dim]) * s
    q = torch.cat([q_rot, q[..., rope_dim:]], dim=-1)
    k_rot = k[..., :rope_dim] * cos + rotate_half(k[..., :rope_dim]) * sin
    k = torch.cat([k_rot, k[..., rope_dim:]], dim=-1)
    keys = cache.write(layer, "index_k", columns, k)  # [B, T, D]
    scores = F.relu(torch.matmul(q.float(), keys.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale)
    weights = indexer.weights_proj(h.to(indexer.weights_proj.weight.dtype)).float() * (indexer.n_heads ** -0.5)
    index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]
    index_scores = index_scores.masked_fill(~mask, float("-inf"))
    topk = min(indexer.index_topk, index_scores.shape[-1])
    order = torch.sort(index_scores, dim=-1, descending=True, stable=True).indices[..., :topk]
    return torch.zeros_like(mask).scatter(-1, order, True)


def _attention(attn, cache, layer: int, h, cos, sin, columns, mask) -> torch.Tensor:
    batch, seq, _ = h.shape
    nope, rope_dim, v_dim = attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim
    q_resid = rms_norm(attn.q_a_layernorm, attn.q_a_proj(h))
    q = attn.q_b_proj(q_resid).view(batch, seq, -1, attn.qk_head_dim).transpose(1, 2)  # [B, H, S, qk]
    compressed = attn.kv_a_proj_with_mqa(h)
    latent = rms_norm(attn.kv_a_layernorm, compressed[..., :attn.kv_lora_rank])  # [B, S, r]
    k_rot = compressed[..., attn.kv_lora_rank:]  # [B, S, rope]
    q_rot = _rotate_interleaved(q[..., nope:], cos.unsqueeze(1), sin.unsqueeze(1))
    k_rot = _rotate_interleaved(k_rot, cos, sin)
    latents = cache.write(layer, "latent", columns, latent)  # [B, T, r]
    k_rots = cache.write(layer, "k_rot", columns, k_rot)  # [B, T, rope]
    query = torch.cat([q[..., :nope], q_rot], dim=-1)
    kv = attn.kv_b_proj(latents.to(h.dtype)).view(batch, latents.shape[1], -1, nope + v_dim).transpose(1, 2)
    heads = kv.shape[1]
    key = torch.cat([kv[..., :nope], k_rots.to(h.dtype).unsqueeze(1).expand(-1, heads, -1, -1)], dim=-1)
    value = kv[..., nope:]
    selected = _indexer_select(attn.indexer, cache, layer, h, q_resid, cos, sin, columns, mask)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=(mask & selected).unsqueeze(1),
                                         scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(batch, seq, heads * v_dim))


def _moe(moe, x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    gate, experts = moe.gate, moe.experts
    scores = F.linear(flat.float(), gate.weight.float()).sigmoid()  # [N, E]
    choice = scores + gate.e_score_correction_bias
    per_group = gate.num_experts // gate.num_group
    group_scores = choice.view(-1, gate.num_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=gate.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, gate.num_group, per_group).reshape(-1, gate.num_experts)
    choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    top_idx = torch.topk(choice, k=gate.top_k, dim=-1, sorted=False)[1]
    top_w = scores.gather(1, top_idx)
    if gate.norm_topk_prob:
        top_w = top_w / (top_w.sum(dim=-1, keepdim=True) + 1e-20)
    top_w = top_w * gate.routed_scaling_factor
    dense_w = torch.zeros_like(scores).scatter(1, top_idx, top_w)  # [N, E], zero for unrouted experts
    gate_up = torch.einsum("nd,efd->enf", flat, experts.gate_up_proj)  # [E, N, 2I]
    g, u = gate_up.chunk(2, dim=-1)
    y = torch.einsum("eni,edi->end", experts.act_fn(g) * u, experts.down_proj)  # [E, N, D]
    routed = (y.float() * dense_w.t().unsqueeze(-1)).sum(dim=0).to(x.dtype)
    return routed.view(shape) + moe.shared_experts(x)


def forward(model, cache, input_ids, positions, columns, mask) -> torch.Tensor:
    inner = model.model
    x = inner.embed_tokens(input_ids)
    cos, sin = rope(positions, inner.rotary_emb.inv_freq, x.dtype)
    cos, sin = cos * inner.rotary_emb.attention_scaling, sin * inner.rotary_emb.attention_scaling
    for i, layer in enumerate(inner.layers):
        h = rms_norm(layer.input_layernorm, x)
        x = x + _attention(layer.self_attn, cache, i, h, cos, sin, columns, mask)
        h = rms_norm(layer.post_attention_layernorm, x)
        x = x + (_moe(layer.mlp, h) if hasattr(layer.mlp, "gate") else layer.mlp(h))
    return model.lm_head(rms_norm(inner.norm, x))
