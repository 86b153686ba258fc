"""KV-cache surgery for step-level continuous batching over transformers' DynamicCache.

A group of running requests shares one batched cache whose time axis is aligned: column c
is the same step for every row, rows shorter than the longest are left-padded, and
positions a request must ignore (padding, rejected speculative drafts) are zeros in the
group's 2-D attention mask. Requests join by left-padding (their own prefilled cache or
the group's) and concatenating along the batch; they leave by row selection, after which
columns that are padding for every row are dropped.

Layers hold tensors with a time axis: ``keys``/``values`` ([B, H, T, D], time at -2; for
DeepSeek-V3.2 the compressed latent and the rotated shared key) and, for sparse-attention
layers, ``indexer_keys`` ([B, T, D], time at 1). Surgery treats them uniformly; it works on
transformers' DynamicCache and on :class:`GrowingCache` alike (both expose ``layers`` whose
tensors it replaces).
"""

from __future__ import annotations

import torch

# (attribute, time dimension)
_TENSORS = (("keys", -2), ("values", -2), ("indexer_keys", 1))


def _layer_tensors(layer) -> list[tuple[str, int, torch.Tensor]]:
    out = []
    for name, dim in _TENSORS:
        value = getattr(layer, name, None)
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.numel() > 0:
            out.append((name, dim, value))
    return out


def _pad_time(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def columns(cache) -> int:
    layer = cache.layers[0]
    return 0 if layer.keys is None or layer.keys.numel() == 0 else layer.keys.shape[-2]


def left_pad(cache, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Prepend ``n`` padding columns to every row; returns the new mask."""
    if n == 0:
        return mask
    for layer in cache.layers:
        for name, dim, value in _layer_tensors(layer):
            setattr(layer, name, _pad_time(value, n, dim))
    return _pad_time(mask, n, 1)


def concat(target, target_mask: torch.Tensor, other, other_mask: torch.Tensor) -> torch.Tensor:
    """Append ``other``'s rows to ``target`` (both aligned to the same column count)."""
    for dst, src in zip(target.layers, other.layers):
        for name, _, value in _layer_tensors(dst):
            setattr(dst, name, torch.cat([value, getattr(src, name)], dim=0))
    return torch.cat([target_mask, other_mask], dim=0)


def merge(target, target_mask: torch.Tensor | None, other, other_mask: torch.Tensor):
    """``target`` (None for an empty group) with ``other``'s rows appended; returns (cache, mask)."""
    if target is None:
        return other, other_mask
    width_t, width_o = target_mask.shape[1], other_mask.shape[1]
    target_mask = left_pad(target, target_mask, max(0, width_o - width_t))
    other_mask = left_pad(other, other_mask, max(0, width_t - width_o))
    return target, concat(target, target_mask, other, other_mask)


def select(cache, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep ``rows`` (int64 indices), then drop columns that are padding for all of them."""
    for layer in cache.layers:
        for name, _, value in _layer_tensors(layer):
            setattr(layer, name, value.index_select(0, rows.to(value.device)))
    mask = mask.index_select(0, rows.to(mask.device))
    return trim(cache, mask)


def trim(cache, mask: torch.Tensor) -> torch.Tensor:
    """Drop leading columns that every row ignores."""
    used = (mask != 0).any(dim=0)
    if not bool(used.any()):
        return mask
    first = int(torch.nonzero(used)[0])
    if first == 0:
        return mask
    for layer in cache.layers:
        for name, dim, value in _layer_tensors(layer):
            index = [slice(None)] * value.dim()
            index[dim] = slice(first, None)
            setattr(layer, name, value[tuple(index)].contiguous())
    return mask[:, first:]


def compact(cache, mask: torch.Tensor) -> torch.Tensor:
    """Squeeze out holes (rejected drafts) so each row's live columns are contiguous and
    right-aligned; keeps the attention cost proportional to live tokens."""
    live = mask != 0
    counts = live.sum(dim=1)
    width = int(counts.max()) if counts.numel() else 0
    if width == mask.shape[1]:
        return mask
    batch = mask.shape[0]
    # Column order per row: dead columns first (stable), then live ones in order.
    order = torch.argsort(live.to(torch.int8), dim=1, stable=True)
    keep = order[:, mask.shape[1] - width:]
    for layer in cache.layers:
        for name, dim, value in _layer_tensors(layer):
            d = dim % value.dim()
            shape = [1] * value.dim()
            shape[0], shape[d] = batch, width
            idx = keep.view(shape).expand(*[value.shape[i] if i not in (0, d) else shape[i]
                                            for i in range(value.dim())])
            setattr(layer, name, torch.gather(value, d, idx.to(value.device)))
    new_mask = torch.gather(mask, 1, keep)
    return new_mask


# Columns a GrowingLayer allocates beyond what it needs when it must reallocate (at least
# this many, or as many as it already holds: amortised O(1) appends).
_GROW_MIN = 64


class GrowingLayer:
    """One layer's ``keys`` and ``values`` [B, H, T, D]: views of the first T columns of
    buffers with room to grow, so that a decode step writes its columns in place instead of
    concatenating (DynamicCache copies the whole cache every step). Surgery (cache.py)
    replaces ``keys``/``values`` with plain tensors; the next append then reallocates.
    Appends write only beyond the current T, so references to an earlier ``keys`` stay a
    consistent snapshot (runner.Group.snapshot)."""

    __slots__ = ("keys", "values", "_buffers")

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def _in_place(self, n: int) -> bool:
        if self._buffers is None or self.keys is None:
            return False
        kbuf, vbuf = self._buffers
        keys, values = self.keys, self.values
        return (keys.data_ptr() == kbuf.data_ptr() and values.data_ptr() == vbuf.data_ptr()
                and keys.shape[:2] == kbuf.shape[:2] and keys.stride() == kbuf.stride()
                and values.shape[:2] == vbuf.shape[:2] and values.stride() == vbuf.stride()
                and keys.shape[-2] + n <= kbuf.shape[-2])

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append keys, values [B, H, n, D] along time; returns the layer's [B, H, T + n, D]."""
        n = keys.shape[-2]
        if not self._in_place(n):
            held = 0 if self.keys is None else self.keys.shape[-2]
            capacity = held + n + max(_GROW_MIN, held)
            buffers = []
            for old, new in ((self.keys, keys), (self.values, values)):
                shape = list(new.shape)
                shape[-2] = capacity
                buf = new.new_empty(shape)
                if held:
                    buf[:, :, :held] = old
                buffers.append(buf)
            self._buffers = (buffers[0], buffers[1])
            self.keys, self.values = buffers[0][:, :, :held], buffers[1][:, :, :held]
        kbuf, vbuf = self._buffers
        held = self.keys.shape[-2]
        kbuf[:, :, held:held + n] = keys
        vbuf[:, :, held:held + n] = values
        self.keys, self.values = kbuf[:, :, :held + n], vbuf[:, :, :held + n]
        return self.keys, self.values


class GrowingCache:
    """Per layer a :class:`GrowingLayer` (the eager Llama forward's cache)."""

    def __init__(self, layers: int) -> None:
        self.layers = [GrowingLayer() for _ in range(layers)]

    def columns(self) -> int:
        return columns(self)
