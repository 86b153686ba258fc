"""Static, preallocated KV caches and the one entry point ``forward``.

Layout: rows are batch slots, columns are cache positions. A row's inputs are written at
the columns the caller names (``columns`` [B, S]); which columns a row attends to is the
caller's ``valid`` mask [B, T] (after this step's writes), intersected with causality
(a query attends to columns at or before its own). Positions (for RoPE) are separate from
columns, so holes left by rejected drafts never shift a request's positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StaticCache:
    """Per layer, a dict of name -> tensor [slots, columns, dim]."""

    layers: list[dict[str, torch.Tensor]]
    slots: int
    columns: int

    @classmethod
    def for_model(cls, model, slots: int, columns: int, device, dtype) -> StaticCache:
        c = model.config
        layers = []
        for _ in range(c.num_hidden_layers):
            if c.model_type == "deepseek_v32":
                shapes = {"latent": c.kv_lora_rank, "k_rot": c.qk_rope_head_dim, "index_k": c.index_head_dim}
            elif c.model_type == "llama":
                head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
                shapes = {"k": c.num_key_value_heads * head_dim, "v": c.num_key_value_heads * head_dim}
            else:
                raise ValueError(f"unknown model type: {c.model_type}; expected one of deepseek_v32, llama")
            layers.append({name: torch.zeros((slots, columns, dim), device=device, dtype=dtype)
                           for name, dim in shapes.items()})
        return cls(layers, slots, columns)

    def write(self, layer: int, name: str, columns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Write values [B, S, D] at rows 0..B-1, ``columns`` [B, S]; returns rows 0..B-1 [B, T, D]."""
        cache = self.layers[layer][name]
        batch = columns.shape[0]
        rows = torch.arange(batch, device=columns.device).unsqueeze(1).expand_as(columns)
        cache.index_put_((rows, columns), values.to(cache.dtype))
        return cache[:batch]


def attend_mask(valid: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """valid [B, T] bool and query columns [B, S] give the attention mask [B, S, T] (True = attend).

    A query always attends to its own column: a padding input (written to a scratch column
    that no row counts as valid) then still has one finite key, so no NaN ever enters the
    cache, where a later query's zero attention weight times NaN would still be NaN."""
    cols = torch.arange(valid.shape[1], device=valid.device).view(1, 1, -1)
    own = cols == columns.unsqueeze(-1)
    return (valid.unsqueeze(1) & (cols <= columns.unsqueeze(-1))) | own


def forward(model, cache: StaticCache, input_ids: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor,
            valid: torch.Tensor) -> torch.Tensor:
    """input_ids, positions, columns [B, S] (int64) and valid [B, T] (bool) -> logits [B, S, V]
    in the model's dtype. Writes this step's keys into ``cache`` rows 0..B-1."""
    model_type = model.config.model_type
    if model_type == "deepseek_v32":
        from service.engines.local.model import dsv32 as arch
    elif model_type == "llama":
        from service.engines.local.model import llama as arch
    else:
        raise ValueError(f"unknown model type: {model_type}; expected one of deepseek_v32, llama")
    mask = attend_mask(valid, columns)
    return arch.forward(model, cache, input_ids, positions, columns, mask, query_bound(valid, columns))


def query_bound(valid: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """[B, S] int32: a query attends to columns below its bound, its own column + 1 (its row's
    columns at or before it), or 0 for a padding input (its scratch column is never valid):
    the attention never visits a column past it (model/attention.py), so its result does
    not depend on how many columns the step's window holds."""
    live = valid.gather(1, columns)
    return torch.where(live, columns + 1, torch.zeros_like(columns)).to(torch.int32)
