"""DeepSeek-V3.2-style model (the bundled target) over a StaticCache: transformers'
DeepseekV32ForCausalLM math with fixed shapes.

- MLA (DeepSeek-V3, arXiv:2405.04434): the cache holds the compressed latent and the
  rotated shared key per column; the latent up-projection is absorbed into the query and
  output weights (:func:`absorbed_weights`), so heads attend to the latents directly.
- Lightning indexer (DeepSeek-V3.2 DSA): per query, ReLU'd multi-head scores weighted per
  head; the ``index_topk`` best columns among those the query may attend to are kept, ties
  broken by column order (a stable sort, as ``service/engines/local/stable_topk.py`` does
  for transformers' indexer), so a row's selection does not depend on its batch.
- MoE: sigmoid router with group-limited top-k (DeepSeek-V3), every expert evaluated for
  every token and weighted by the (mostly zero) routing weights: no data-dependent loop,
  so the step is capturable; plus the shared experts. Every product is a plain matrix
  product whose rows do not depend on the batch (see _moe).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from service.engines.local.model import attention
from service.engines.local.model.matmul import batched_linear
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
    weights = indexer.weights_proj(h.to(indexer.weights_proj.weight.dtype)).float() * (indexer.n_heads ** -0.5)
    index_scores = attention.index_scores(q, keys, weights, indexer.softmax_scale)  # [B, S, T]
    index_scores = index_scores.masked_fill(~mask, float("-inf"))
    topk = min(indexer.index_topk, index_scores.shape[-1])
    order = torch.sort(index_scores, dim=-1, descending=True, stable=True).indices[..., :topk]
    return torch.zeros_like(mask).scatter(-1, order, True)


def absorbed_weights(attn, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA with the latent up-projection absorbed (DeepSeek-V2 section 2.1.3), as two linear
    weights: queries [H * (r + rope), q_lora] (per head, W_UK[h]^T W_Q_nope[h] stacked over
    the heads, then the rotary rows W_Q_rope unchanged), so that q_latent . latent = q_nope .
    k_nope; and the output [hidden, H * r] (W_O[:, h] W_UV[h]), so that o_proj(values) =
    w_o . (attention over the latents). Computed in float32 once per module and dtype."""
    key = (attn.q_b_proj.weight.data_ptr(), attn.kv_b_proj.weight.data_ptr(), attn.o_proj.weight.data_ptr(), dtype)
    cached = attn.__dict__.get("_hallmark_absorbed")
    if cached is not None and cached[0] == key:
        return cached[1]
    if attn.q_b_proj.bias is not None or attn.kv_b_proj.bias is not None:
        raise ValueError("MLA weight absorption needs q_b_proj and kv_b_proj without bias")
    heads, nope, rope, v_dim, rank = (attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim,
                                      attn.v_head_dim, attn.kv_lora_rank)
    with torch.no_grad():
        wq = attn.q_b_proj.weight.float().view(heads, nope + rope, -1)  # [H, qk, q_lora]
        wkv = attn.kv_b_proj.weight.float().view(heads, nope + v_dim, rank)  # [H, nope + v, r]
        w_q = torch.cat([torch.einsum("hnr,hnq->hrq", wkv[:, :nope], wq[:, :nope]).reshape(heads * rank, -1),
                         wq[:, nope:].reshape(heads * rope, -1)]).to(dtype)
        wo = attn.o_proj.weight.float().view(-1, heads, v_dim)  # [hidden, H, v]
        w_o = torch.einsum("dhv,hvr->dhr", wo, wkv[:, nope:]).reshape(wo.shape[0], heads * rank).to(dtype)
    attn.__dict__["_hallmark_absorbed"] = (key, (w_q, w_o))
    return w_q, w_o


def _attention(attn, cache, layer: int, h, cos, sin, columns, mask, bound) -> torch.Tensor:
    """MLA over the cached latents with absorbed weights: every head attends to the one
    shared key [latent | rotary key] and value (the latent), so nothing is expanded per
    column; the attention itself is batch-invariant (model/attention.py)."""
    batch, seq, _ = h.shape
    heads, rope_dim, rank = attn.num_heads, attn.qk_rope_head_dim, attn.kv_lora_rank
    w_q, w_o = absorbed_weights(attn, h.dtype)
    q_resid = rms_norm(attn.q_a_layernorm, attn.q_a_proj(h))
    q = F.linear(q_resid, w_q)
    q_latent = q[..., :heads * rank].view(batch, seq, heads, rank)
    q_rot = _rotate_interleaved(q[..., heads * rank:].view(batch, seq, heads, rope_dim), cos.unsqueeze(2),
                                sin.unsqueeze(2))
    compressed = attn.kv_a_proj_with_mqa(h)
    latent = rms_norm(attn.kv_a_layernorm, compressed[..., :rank])  # [B, S, r]
    k_rot = _rotate_interleaved(compressed[..., rank:], cos, sin)  # [B, S, rope]
    latents = cache.write(layer, "latent", columns, latent)  # [B, T, r]
    k_rots = cache.write(layer, "k_rot", columns, k_rot)  # [B, T, rope]
    selected = _indexer_select(attn.indexer, cache, layer, h, q_resid, cos, sin, columns, mask)
    out = attention.attention(q_latent, latents.unsqueeze(2), latents.unsqueeze(2), mask & selected, bound,
                              attn.scaling, q2=q_rot, k2=k_rots.unsqueeze(2))  # [B, S, H, r] float32
    return F.linear(out.reshape(batch, seq, heads * rank).to(h.dtype), w_o, attn.o_proj.bias)


def _moe(moe, x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    gate, experts = moe.gate, moe.experts
    scores = batched_linear(flat.float().unsqueeze(0), gate.weight.float().unsqueeze(0))[0].sigmoid()  # [N, E]
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
    # Row-invariant products (model/matmul.py) and a fixed-order sum over the experts: a
    # row's result must not depend on N (the batch bucket); cuBLAS's did for N >= 40 on the
    # H200 (bf16; tests/service/engines/local/model/test_batch_invariance.py).
    num, inter = experts.gate_up_proj.shape[0], experts.gate_up_proj.shape[1] // 2
    gate_up = batched_linear(flat.unsqueeze(0), experts.gate_up_proj.reshape(1, num * 2 * inter, -1))[0]
    g, u = gate_up.view(-1, num, 2 * inter).chunk(2, dim=-1)
    hidden = (experts.act_fn(g) * u).transpose(0, 1).contiguous()  # [E, N, I]
    down = batched_linear(hidden, experts.down_proj)  # [E, N, D]
    routed = None
    for e in range(num):
        term = down[e].float() * dense_w[:, e:e + 1]
        routed = term if routed is None else routed + term
    routed = routed.to(x.dtype)
    return routed.view(shape) + moe.shared_experts(x)


def forward(model, cache, input_ids, positions, columns, mask, bound) -> torch.Tensor:
    inner = model.model
    x = inner.embed_tokens(input_ids)
    cos, sin = rope(positions, inner.rotary_emb.inv_freq, x.dtype)
    cos, sin = cos * inner.rotary_emb.attention_scaling, sin * inner.rotary_emb.attention_scaling
    for i, layer in enumerate(inner.layers):
        h = rms_norm(layer.input_layernorm, x)
        x = x + _attention(layer.self_attn, cache, i, h, cos, sin, columns, mask, bound)
        h = rms_norm(layer.post_attention_layernorm, x)
        x = x + (_moe(layer.mlp, h) if hasattr(layer.mlp, "gate") else layer.mlp(h))
    return model.lm_head(rms_norm(inner.norm, x))
