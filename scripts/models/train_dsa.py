"""Sparse-attention training hooks (target only): the training attention function that applies the
indexer's selection and records attention, the indexer's KL loss, and MoE load balancing."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DeepseekV32ForCausalLM
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

from train_common import TRAIN_ATTN


def _bool_keep_mask(attention_mask: torch.Tensor, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """[B|1, 1, S, T] keep-mask (True = may attend) from a bool or additive float mask."""
    if attention_mask.dtype != torch.bool:
        attention_mask = attention_mask == 0
    return attention_mask.expand(shape[0], 1, shape[2], shape[3])


def dsa_train_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, indices=None, **kwargs):
    """SDPA with the indexer's top-k selection applied, recording dense probabilities for the KL.

    ``attention_mask`` is the causal (+padding) mask only: for non-eager/sdpa implementations the
    DeepseekV32 attention passes the indexer's ``indices`` [B, S, k] instead of folding them in.
    """
    b, _, s, _ = query.shape
    t = key.shape[2]
    keep = _bool_keep_mask(attention_mask, (b, 1, s, t))
    if indices is not None:
        selected = torch.zeros((b, s, t), dtype=torch.bool, device=query.device)
        selected.scatter_(-1, indices.long(), True)
        attend = keep & selected.unsqueeze(1)
    else:
        selected = None
        attend = keep
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attend, dropout_p=dropout if module.training else 0.0, scale=scaling
    )
    tap = getattr(module, "_hallmark_tap", None)
    if tap is not None and tap.active:
        with torch.no_grad():
            logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
            probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1).mean(dim=1)  # [B, S, T]
            tap.attn[module.layer_idx] = (probs, keep[:, 0], selected)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(TRAIN_ATTN, dsa_train_attention)


AttentionMaskInterface.register(TRAIN_ATTN, sdpa_mask)


def indexer_scores(ix, hidden_states, q_resid, cos, sin) -> torch.Tensor:
    """The DeepseekV32Indexer's scores, with gradient (its forward is @torch.no_grad()).

    Mirrors transformers' DeepseekV32Indexer.forward up to the top-k: [B, S, T] float32.
    """
    b, s, _ = hidden_states.shape
    q = ix.wq_b(q_resid).view(b, s, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    weights = ix.weights_proj(hidden_states.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads**-0.5)
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)


class DSATap:
    """Captures each layer's indexer inputs and dense attention probabilities during a forward."""

    _ARG_NAMES = ("hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids")

    def __init__(self, model: DeepseekV32ForCausalLM):
        self.active = False
        self.inputs: dict[int, tuple] = {}
        self.attn: dict[int, tuple] = {}
        self.handles = []
        for layer in model.model.layers:
            attn = layer.self_attn
            attn._hallmark_tap = self
            self.handles.append(
                attn.indexer.register_forward_hook(functools.partial(self._hook, attn.layer_idx), with_kwargs=True)
            )

    def _hook(self, layer_idx, module, args, kwargs, output):
        if not self.active:
            return
        a = dict(zip(self._ARG_NAMES, args))
        a.update(kwargs)
        cos, sin = a["position_embeddings"]
        self.inputs[layer_idx] = (a["hidden_states"].detach(), a["q_resid"].detach(), cos.detach(), sin.detach())

    def clear(self):
        self.inputs.clear()
        self.attn.clear()

    def remove(self, model):
        for h in self.handles:
            h.remove()
        for layer in model.model.layers:
            layer.self_attn._hallmark_tap = None


def indexer_kl_loss(model, tap: DSATap, support_mode: str) -> tuple[torch.Tensor, float]:
    """Mean over layers and query positions of CE(p_attn, softmax(I)); returns (loss, mean KL)."""
    losses, kls = [], []
    for li, (h, qr, cos, sin) in sorted(tap.inputs.items()):
        p, keep, selected = tap.attn[li]
        ix = model.model.layers[li].self_attn.indexer
        scores = indexer_scores(ix, h, qr, cos, sin)
        support = keep if (support_mode == "causal" or selected is None) else keep & selected
        if support is not keep:
            p = p * support
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
        logq = torch.log_softmax(scores.masked_fill(~support, float("-inf")), dim=-1).masked_fill(~support, 0.0)
        ce = -(p * logq).sum(-1)
        ent = -(torch.special.xlogy(p, p)).sum(-1)
        losses.append(ce.mean())
        kls.append((ce - ent).mean().item())
    return torch.stack(losses).mean(), sum(kls) / max(len(kls), 1)


def set_index_topk(model, topk: int | None) -> None:
    """Override every indexer's top-k (None = the config's value; a huge value = dense)."""
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = model.config.index_topk if topk is None else topk


class MoEBalancer:
    """DeepSeek-V3 auxiliary-loss-free balancing: nudge each router's e_score_correction_bias."""

    def __init__(self, model, rate: float):
        self.rate = rate
        self.routers = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        self.counts = {id(r): torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers}
        self.total = {id(r): torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers}
        self.handles = [r.register_forward_hook(self._hook) for r in self.routers]

    def _hook(self, module, args, output):
        if module.training:
            idx = output[2].reshape(-1)
            self.counts[id(module)] += torch.bincount(idx, minlength=module.num_experts).to(self.counts[id(module)])

    @torch.no_grad()
    def step(self):
        for r in self.routers:
            c = self.counts[id(r)]
            if self.rate > 0 and c.sum() > 0:
                r.e_score_correction_bias += self.rate * torch.sign(c.mean() - c)
            self.total[id(r)] += c
            c.zero_()

    def load_summary(self) -> list[list[float]]:
        out = []
        for r in self.routers:
            t = self.total[id(r)]
            out.append([round(float(x), 4) for x in (t / t.sum().clamp_min(1)).tolist()])
        return out

    def remove(self):
        for h in self.handles:
            h.remove()
