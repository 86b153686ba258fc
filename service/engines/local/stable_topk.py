"""Deterministic top-k in DeepSeek-V3.2's lightning indexer (transformers 5.19).

The indexer ranks keys by ReLU'd scores, so several keys often tie at exactly 0 at the
top-k boundary (1.7 % of query/layer pairs on validation text, scripts/models/NOTES.md).
``torch.topk`` breaks such ties differently for different tensor shapes, so the same
request would attend to different keys alone, in a batch, in a prefill or in a
speculative verify pass, and its text would depend on who else was being served. A stable
descending sort breaks ties by key column, the same way for every shape; scores, masking
and everything else are transformers' own.

Applied only to the transformers release whose indexer this mirrors (the pinned one); on
any other version the stock indexer runs and a warning says so.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger("hallmark.engine.local")
MIRRORED_RELEASE = "5.19."


def _stable_forward(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids=None,
                    past_key_values=None):
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    batch_size, seq_len, _ = hidden_states.shape
    cos, sin = position_embeddings
    q = self.wq_b(q_resid).view(batch_size, seq_len, self.n_heads, self.head_dim)
    split = [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim]
    q_rot, q_pass = torch.split(q, split, dim=-1)
    k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, split, dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    if past_key_values is not None:
        k = past_key_values.update_indexer(k, self.layer_idx)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale)
    weights = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float() * (self.n_heads ** -0.5)
    index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
    if attention_mask.dtype == torch.bool:
        index_scores = index_scores.masked_fill(~attention_mask, float("-inf"))
    else:
        index_scores = index_scores + attention_mask
    topk = min(self.index_topk, index_scores.shape[-1])
    order = torch.sort(index_scores, dim=-1, descending=True, stable=True).indices
    return order[..., :topk].to(torch.int32)


def apply(model) -> bool:
    """Give every DeepSeek-V3.2 indexer in ``model`` the stable selection; True if applied."""
    import transformers

    indexers = [m for m in model.modules() if type(m).__name__ == "DeepseekV32Indexer"]
    if not indexers:
        return False
    if not transformers.__version__.startswith(MIRRORED_RELEASE):
        log.warning("transformers %s: the DeepSeek-V3.2 indexer keeps torch.topk (ties may make outputs depend "
                    "on batch composition)", transformers.__version__)
        return False
    stable = torch.no_grad()(_stable_forward)
    for indexer in indexers:
        indexer.forward = stable.__get__(indexer, type(indexer))
    return True
