"""Model forward passes for a group of running requests sharing one batched KV cache.

Prefill runs per request (no padding); decoding runs the whole group at once. Each row
keeps its own next position, so left padding, rejected drafts and joins never shift a
request's positions (the cache's columns and the positions are decoupled; the 2-D
attention mask says which columns a row attends to).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from service.engines.local import cache as kv
from service.engines.local import eager_llama, stable_topk
from watermark.transfer import to_device

# Compact a group's cache when this share of its columns are holes.
_HOLE_SHARE_TO_COMPACT = 0.25


def load_model(path: str, device: torch.device):
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(device)
    model.eval()
    stable_topk.apply(model)
    return model


@dataclass
class Group:
    """One model's batched state for a set of requests (row order = ``ids``)."""

    model: object
    device: torch.device
    ids: list[str] = field(default_factory=list)
    cache: object | None = None
    mask: torch.Tensor | None = None  # [B, T] int64, 1 = attend
    next_pos: torch.Tensor | None = None  # [B] int64
    # Telemetry counters (read by service.engines.local.telemetry).
    eager_forwards: int = 0
    graph_replays: int = 0
    compactions: int = 0

    def __post_init__(self) -> None:
        # On the CPU a Llama runs through eager_llama (the same operations without
        # transformers' per-call overhead, over an in-place growing cache).
        self.eager = self.device.type == "cpu" and eager_llama.supports(self.model)
        self.head = eager_llama.Head(self.model.lm_head.weight) if self.eager else None

    def __len__(self) -> int:
        return len(self.ids)

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], ahead: int = 0) -> tuple[object, torch.Tensor, torch.Tensor]:
        """Run one prompt alone; returns (its cache, its mask [1, T], last logits [V] float32)."""
        ids = torch.tensor([prompt_ids], dtype=torch.int64, device=self.device)
        self.eager_forwards += 1
        if self.eager:
            cache = kv.GrowingCache(self.model.config.num_hidden_layers)
            mask = torch.ones_like(ids)
            positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0)
            logits = eager_llama.forward(self.model, cache, ids, mask, positions, self.head)
            return cache, mask, logits[0, -1].float()
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=True)
        return cache, torch.ones_like(ids), out.logits[0, -1].float()

    def snapshot(self):
        """References to this group's state (tensors are replaced, never written in place, by
        forward passes and cache surgery, so references are a consistent copy)."""
        layers = []
        if self.cache is not None:
            layers = [(layer, name, value) for layer in self.cache.layers for name, _, value in kv._layer_tensors(layer)]  # noqa: SLF001
        return list(self.ids), self.cache, self.mask, self.next_pos, layers

    def restore(self, saved) -> None:
        self.ids, self.cache, self.mask, self.next_pos, layers = saved
        for layer, name, value in layers:
            setattr(layer, name, value)

    def occupancy(self) -> tuple[int, int, int]:
        """(live KV tokens, allocated KV tokens, layers caching indexer keys), read now."""
        mask, cache = self.mask, self.cache  # references: consistent even mid-step
        if mask is None or cache is None:
            return 0, 0, 0
        layers = sum(1 for layer in cache.layers if getattr(layer, "indexer_keys", None) is not None)
        return int((mask != 0).sum()), int(mask.numel()), layers

    def join(self, request_id: str, cache, mask: torch.Tensor, next_pos: int) -> None:
        self.cache, self.mask = kv.merge(self.cache, self.mask, cache, mask)
        pos = torch.tensor([next_pos], dtype=torch.int64, device=self.device)
        self.next_pos = pos if self.next_pos is None else torch.cat([self.next_pos, pos])
        self.ids.append(request_id)

    def join_many(self, request_ids: list[str], caches: list, masks: list[torch.Tensor], next_pos: list[int]) -> None:
        for request_id, cache, mask, pos in zip(request_ids, caches, masks, next_pos):
            self.join(request_id, cache, mask, pos)

    def keep(self, keep_ids: list[str]) -> None:
        """Drop every row not in ``keep_ids`` (order preserved)."""
        if keep_ids == self.ids:
            return
        if not keep_ids:
            self.ids, self.cache, self.mask, self.next_pos = [], None, None, None
            return
        where = {rid: i for i, rid in enumerate(self.ids)}
        rows = torch.tensor([where[i] for i in keep_ids], dtype=torch.int64, device=self.device)
        self.mask = kv.select(self.cache, self.mask, rows)
        self.next_pos = self.next_pos.index_select(0, rows)
        self.ids = list(keep_ids)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, n] (live [B, n] marks real inputs; others are placeholders the model
        must ignore) -> logits [B, n, V] float32. Appends n columns to the group."""
        if live is None:
            live = torch.ones_like(input_ids)
        live = live.to(torch.int64)
        positions = self.next_pos.unsqueeze(1) + torch.cumsum(live, dim=1) - 1
        positions = positions.clamp(min=0)
        self.mask = torch.cat([self.mask, live], dim=1)
        self.eager_forwards += 1
        if self.eager:
            logits = eager_llama.forward(self.model, self.cache, input_ids, self.mask, positions, self.head)
        else:
            logits = self.model(input_ids=input_ids, attention_mask=self.mask, position_ids=positions,
                                past_key_values=self.cache, use_cache=True).logits
        self.next_pos = self.next_pos + live.sum(dim=1)
        return logits.float()

    def reject_tail(self, counts: torch.Tensor, on_device: torch.Tensor | None = None) -> None:
        """Turn each row's last ``counts[b]`` live columns into holes (rejected drafts);
        ``counts`` [B] int64 may be a host tensor; ``on_device``: the same on the device."""
        if not bool((counts > 0).any()):
            return
        counts = to_device(counts, self.mask.device) if on_device is None else on_device
        width = self.mask.shape[1]
        cols = torch.arange(width, device=self.mask.device).unsqueeze(0)
        live_rank = torch.cumsum(self.mask.flip(1), dim=1).flip(1)  # live columns at or after c
        drop = (self.mask != 0) & (live_rank <= counts.unsqueeze(1)) & (cols >= 0)
        self.mask = self.mask.masked_fill(drop, 0)
        self.next_pos = self.next_pos - counts
        holes = (self.mask == 0).sum().item()
        if holes > _HOLE_SHARE_TO_COMPACT * self.mask.numel():
            self.mask = kv.compact(self.cache, self.mask)
            self.compactions += 1
