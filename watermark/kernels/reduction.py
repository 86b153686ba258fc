"""Cross-block reduction: the programs of one row merge their (score, token) inside the
kernel, the last to finish reducing the row, with a per-stream workspace on the host."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark.kernels.tiles import BIG_INDEX, NEG_INF


@triton.jit
def combine_blocks(part_s_ptr, part_i_ptr, count_ptr, slot, blk, nblk, best_s, best_i, NB: tl.constexpr):
    """Cross-block reduction inside the kernel: each program of a row writes its (score,
    token), then takes a ticket; the program that arrives last reduces the row
    (lexicographic: higher score, then lower token) and resets the row's counter.

    ``slot`` indexes the row's counter and partials (nblk entries from slot * nblk).
    Returns (is_last, score, token); with one block per row every program is last.
    """
    last = nblk == 1
    s_out = best_s
    i_out = best_i
    if nblk > 1:
        base = slot.to(tl.int64) * nblk
        tl.store(part_s_ptr + base + blk, best_s)
        tl.store(part_i_ptr + base + blk, best_i)
        tl.debug_barrier()
        ticket = tl.atomic_add(count_ptr + slot, 1, sem="acq_rel", scope="gpu")
        last = ticket == nblk - 1
        if last:
            tl.debug_barrier()
            s_out = tl.full([], NEG_INF, tl.float32)
            i_out = tl.full([], BIG_INDEX, tl.int32)
            for b0 in range(0, nblk, NB):
                idx = b0 + tl.arange(0, NB)
                ps = tl.load(part_s_ptr + base + idx, mask=idx < nblk, other=float("-inf"), volatile=True)
                pi = tl.load(part_i_ptr + base + idx, mask=idx < nblk, other=2**31 - 1, volatile=True)
                cs = tl.max(ps, 0)
                ci = tl.min(tl.where(ps == cs, pi, BIG_INDEX), 0)
                better = (cs > s_out) | ((cs == s_out) & (ci < i_out))
                s_out = tl.where(better, cs, s_out)
                i_out = tl.where(better, ci, i_out)
            tl.store(count_ptr + slot, 0)
    return last, s_out, i_out


class Workspace:
    """Per-(device, stream) scratch of the cross-block reduction: a counter per row slot
    (kept at zero between launches: the last program of a row resets it) and partials."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.counters = torch.zeros(0, dtype=torch.int32, device=device)
        self.scores = torch.empty(0, dtype=torch.float32, device=device)
        self.tokens = torch.empty(0, dtype=torch.int32, device=device)
        self.scratch = torch.empty(0, dtype=torch.int32, device=device)

    def reserve(self, slots: int, partials: int, scratch: int = 0) -> "Workspace":
        if self.counters.numel() < slots:
            self.counters = torch.zeros(max(slots, 2 * self.counters.numel()), dtype=torch.int32,
                                        device=self.device)
        if self.scores.numel() < partials:
            size = max(partials, 2 * self.scores.numel())
            self.scores = torch.empty(size, dtype=torch.float32, device=self.device)
            self.tokens = torch.empty(size, dtype=torch.int32, device=self.device)
        if self.scratch.numel() < max(scratch, 1):
            self.scratch = torch.empty(max(scratch, 1, 2 * self.scratch.numel()), dtype=torch.int32,
                                       device=self.device)
        return self


_WORKSPACES: dict[tuple, Workspace] = {}


def workspace(device: torch.device, slots: int, partials: int, scratch: int = 0) -> Workspace:
    """The workspace for the current stream of ``device``; launches on one stream are
    ordered, so they share it safely. Grow it before capturing a CUDA graph."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = Workspace(device)
    return _WORKSPACES[key].reserve(slots, partials, scratch)
