"""Hashed context deduplication on the GPU (reference: :class:`watermark.dedup.ContextDeduper`).

Per request slot the device keeps the token history (behind a prefix of PAD entries, so
the context of position p, the w entries before it in ``[PAD] * w + history``, is one
contiguous window) and an open-addressing table from a 64-bit hash of a context to the
*last* history position holding that context. A slot is verified against the history
before it counts, so hash collisions cost a probe, never a wrong decision. Insert and
lookup are O(1) per token (expected; the table is kept at most half full), independent of
the history length, and no entry ever needs evicting: a lookup that finds a last position
older than the window (max_history) answers "not repeated", exactly as the reference
after its own eviction.

Decisions are those of :meth:`ContextDeduper.next_repeated` / :meth:`~ContextDeduper.block_repeated`:
scope "none" never repeats; scope "all" skips contexts that still hold padding (fewer
than w generated tokens); otherwise the next position L repeats iff its context occurs at
some p in [L - H, L) (H = max_history, or all of them), and a speculative position L + j
also checks the block's earlier positions L .. L + j - 1.

Kernels (one program per request row): ``_dedup_append_kernel`` commits tokens (prompt or
generated), ``_dedup_query_kernel`` answers a block of positions without changing state,
``_dedup_step_kernel`` does a decode step's commit, query and context read in one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark.kernels import launch
from watermark.transfer import host_tensor

# Mirrors of watermark.dedup.PAD and watermark.spec.DEDUP_SCOPES / MAX_CONTEXT_WIDTH (a CPU
# test asserts they agree): watermark.dedup imports the pydantic spec module, which the
# GPU image does not carry, and these kernels must run there.
PAD = -1
SCOPES = ("none", "single_turn", "all")
MAX_WIDTH = 16
SCOPE_NONE = tl.constexpr(0)
SCOPE_ALL = tl.constexpr(2)
LANES = tl.constexpr(MAX_WIDTH)
PAD_VALUE = tl.constexpr(PAD)
OFFSET = tl.constexpr(MAX_WIDTH)  # history position p lives at buffer index OFFSET + p

_H1 = tl.constexpr(0x9E3779B97F4A7C15)
_H2 = tl.constexpr(0xBF58476D1CE4E5B9)
_H3 = tl.constexpr(0x94D049BB133111EB)


@triton.jit
def context_hash(window, width):
    """64-bit hash of the first ``width`` entries of ``window`` (int32 [LANES]), order-sensitive."""
    lane = tl.arange(0, LANES)
    x = (window.to(tl.uint32).to(tl.uint64) + (lane + 1).to(tl.uint64) * _H1) * _H2
    x = x ^ (x >> 31)
    h = tl.sum(tl.where(lane < width, x, 0).to(tl.uint64), 0)
    h = (h ^ (h >> 29)) * _H3
    return h ^ (h >> 32)


@triton.jit
def history_window(hist_row, position, width):
    """Context of committed history position ``position`` (entries position - w .. position - 1)."""
    lane = tl.arange(0, LANES)
    return tl.load(hist_row + OFFSET + position - width + lane, mask=lane < width, other=0, volatile=True)


@triton.jit
def block_window(hist_row, drafts_row, length, position, width):
    """Context of position ``position`` >= length of a speculative block: committed history
    below ``length``, then the block's drafts (drafts_row[i] sits at position length + i)."""
    lane = tl.arange(0, LANES)
    src = position - width + lane
    committed = tl.load(hist_row + OFFSET + src, mask=(lane < width) & (src < length), other=0)
    drafted = tl.load(drafts_row + (src - length), mask=(lane < width) & (src >= length), other=0).to(tl.int32)
    return tl.where(src < length, committed, drafted)


@triton.jit
def same_context(a, b, width):
    lane = tl.arange(0, LANES)
    return tl.sum(((a != b) & (lane < width)).to(tl.int32), 0) == 0


@triton.jit
def find_last(table_row, hist_row, tmask, window, width):
    """Last committed position whose context equals ``window``, or -1."""
    slot = (context_hash(window, width) & tmask.to(tl.uint64)).to(tl.int32)
    found = tl.full([], -1, tl.int32)
    searching = tl.full([], 1, tl.int1)
    while searching:
        entry = tl.load(table_row + slot, volatile=True)
        if entry < 0:
            searching = tl.full([], 0, tl.int1)  # an empty slot: not present
        else:
            if same_context(history_window(hist_row, entry, width), window, width):
                found = entry
                searching = tl.full([], 0, tl.int1)
        slot = (slot + 1) & tmask
    return found


@triton.jit
def insert_last(table_row, hist_row, tmask, window, width, position):
    """Record ``position`` as the last position of its context ``window``."""
    slot = (context_hash(window, width) & tmask.to(tl.uint64)).to(tl.int32)
    searching = tl.full([], 1, tl.int1)
    while searching:
        entry = tl.load(table_row + slot, volatile=True)
        take = entry < 0
        if entry >= 0:
            take = same_context(history_window(hist_row, entry, width), window, width)
        if take:
            tl.store(table_row + slot, position)
            searching = tl.full([], 0, tl.int1)
        slot = (slot + 1) & tmask


# Nothing here selects a compiled variant: one compile per kernel serves every batch.
DEDUP_OPTIONS = {"num_warps": 1}
_APPEND_ARGS = ["hist_ptr", "table_ptr", "length_ptr", "generated_ptr", "width_ptr", "scope_ptr", "overflow_ptr",
                "slots_ptr", "tokens_ptr", "tokens_stride", "counts_ptr", "capacity", "table_size", "generated_flag"]
_QUERY_ARGS = ["hist_ptr", "table_ptr", "length_ptr", "generated_ptr", "width_ptr", "scope_ptr", "history_ptr",
               "slots_ptr", "drafts_ptr", "drafts_stride", "k", "out_ptr", "capacity", "table_size"]


@triton.jit(do_not_specialize=_APPEND_ARGS)
def _dedup_append_kernel(hist_ptr, table_ptr, length_ptr, generated_ptr, width_ptr, scope_ptr, overflow_ptr,
                         slots_ptr, tokens_ptr, tokens_stride, counts_ptr, capacity, table_size, generated_flag):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    hist_row = hist_ptr + slot * (capacity + OFFSET)
    table_row = table_ptr + slot * table_size
    tmask = table_size - 1
    width = tl.load(width_ptr + slot)
    scope = tl.load(scope_ptr + slot)
    length = tl.load(length_ptr + slot)
    count = tl.load(counts_ptr + row)
    for t in range(0, count):
        if length < capacity:
            token = tl.load(tokens_ptr + row * tokens_stride + t).to(tl.int32)
            if scope != SCOPE_NONE:
                insert_last(table_row, hist_row, tmask, history_window(hist_row, length, width), width, length)
            tl.store(hist_row + OFFSET + length, token)
            tl.debug_barrier()  # the next context reads this entry
            length += 1
        else:
            tl.store(overflow_ptr + slot, 1)
    tl.store(length_ptr + slot, length)
    tl.store(generated_ptr + slot, tl.load(generated_ptr + slot) + count * generated_flag)


@triton.jit(do_not_specialize=_QUERY_ARGS)
def _dedup_query_kernel(hist_ptr, table_ptr, length_ptr, generated_ptr, width_ptr, scope_ptr, history_ptr,
                        slots_ptr, drafts_ptr, drafts_stride, k, out_ptr, capacity, table_size):
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    hist_row = hist_ptr + slot * (capacity + OFFSET)
    table_row = table_ptr + slot * table_size
    drafts_row = drafts_ptr + row * drafts_stride
    tmask = table_size - 1
    width = tl.load(width_ptr + slot)
    scope = tl.load(scope_ptr + slot)
    window_h = tl.load(history_ptr + slot)  # max_history, or -1 for the whole history
    length = tl.load(length_ptr + slot)
    generated = tl.load(generated_ptr + slot)
    for j in range(0, k + 1):
        position = length + j
        repeated = tl.full([], 0, tl.int1)
        if scope == SCOPE_ALL:
            repeated = generated + j < width
        if (scope != SCOPE_NONE) & (repeated == 0):
            window = block_window(hist_row, drafts_row, length, position, width)
            horizon = tl.where(window_h < 0, -1, position - window_h)
            last = find_last(table_row, hist_row, tmask, window, width)
            repeated = (last >= 0) & (last >= horizon)
            for i in range(0, j):  # the block's earlier positions
                earlier = length + i
                if (earlier >= horizon) & (repeated == 0):
                    repeated = same_context(block_window(hist_row, drafts_row, length, earlier, width), window,
                                            width)
        tl.store(out_ptr + row * (k + 1) + j, repeated.to(tl.int8))


_STEP_ARGS = ["hist_ptr", "table_ptr", "length_ptr", "generated_ptr", "width_ptr", "scope_ptr", "history_ptr",
              "overflow_ptr", "slots_ptr", "commit_ptr", "pending_ptr", "ctx_ptr", "mark_ptr", "pos_ptr", "capacity",
              "table_size"]


@triton.jit(do_not_specialize=_STEP_ARGS)
def _dedup_step_kernel(hist_ptr, table_ptr, length_ptr, generated_ptr, width_ptr, scope_ptr, history_ptr,
                       overflow_ptr, slots_ptr, commit_ptr, pending_ptr, ctx_ptr, mark_ptr, pos_ptr, capacity,
                       table_size):
    """One decode step of a row's request: commit its pending token if ``commit`` (as
    ``_dedup_append_kernel`` with one generated token), then answer the next position (as
    ``_dedup_query_kernel`` with k = 0) and write what the sampler reads: the context
    (int64 [LANES], PAD past the width), the watermark flag (not repeated) and the position
    (generated tokens so far)."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    hist_row = hist_ptr + slot * (capacity + OFFSET)
    table_row = table_ptr + slot * table_size
    tmask = table_size - 1
    width = tl.load(width_ptr + slot)
    scope = tl.load(scope_ptr + slot)
    length = tl.load(length_ptr + slot)
    generated = tl.load(generated_ptr + slot)
    if tl.load(commit_ptr + row) != 0:
        if length < capacity:
            token = tl.load(pending_ptr + slot).to(tl.int32)
            if scope != SCOPE_NONE:
                insert_last(table_row, hist_row, tmask, history_window(hist_row, length, width), width, length)
            tl.store(hist_row + OFFSET + length, token)
            tl.debug_barrier()  # the context below reads this entry
            length += 1
            tl.store(length_ptr + slot, length)
        else:
            tl.store(overflow_ptr + slot, 1)
        generated += 1
        tl.store(generated_ptr + slot, generated)
    window_h = tl.load(history_ptr + slot)
    repeated = tl.full([], 0, tl.int1)
    if scope == SCOPE_ALL:
        repeated = generated < width
    window = history_window(hist_row, length, width)
    if (scope != SCOPE_NONE) & (repeated == 0):
        horizon = tl.where(window_h < 0, -1, length - window_h)
        last = find_last(table_row, hist_row, tmask, window, width)
        repeated = (last >= 0) & (last >= horizon)
    lane = tl.arange(0, LANES)
    tl.store(ctx_ptr + row * LANES + lane, tl.where(lane < width, window, PAD_VALUE).to(tl.int64))
    tl.store(mark_ptr + row, (repeated == 0).to(tl.int8))
    tl.store(pos_ptr + row, generated.to(tl.int64))


class GpuDeduper:
    """Context histories of up to ``slots`` concurrent requests on one device.

    ``capacity`` bounds each request's history (prompt for scope "all", plus generated
    tokens); appends beyond it are dropped and flagged in :attr:`overflow`.
    """

    def __init__(self, slots: int, capacity: int, device: torch.device | str) -> None:
        if slots < 1 or capacity < 1:
            raise ValueError("slots and capacity must be >= 1")
        self.device = torch.device(device)
        self.capacity = capacity
        self.table_size = 1 << max(4, (2 * capacity - 1).bit_length())  # load factor <= 1/2
        self.history = torch.full((slots, capacity + MAX_WIDTH), PAD, dtype=torch.int32, device=self.device)
        self.table = torch.full((slots, self.table_size), -1, dtype=torch.int32, device=self.device)
        self.length = torch.zeros(slots, dtype=torch.int32, device=self.device)
        self.generated = torch.zeros(slots, dtype=torch.int32, device=self.device)
        self.width = torch.ones(slots, dtype=torch.int32, device=self.device)
        self.scope = torch.zeros(slots, dtype=torch.int8, device=self.device)
        self.max_history = torch.full((slots,), -1, dtype=torch.int32, device=self.device)
        self.overflow = torch.zeros(slots, dtype=torch.int32, device=self.device)

    def open(self, slot: int, *, width: int, scope: str, max_history: int | None, prompt=()) -> None:
        """Start a request in ``slot`` (as ContextDeduper(width, scope, max_history, prompt))."""
        if not 1 <= width <= MAX_WIDTH:
            raise ValueError(f"context width must be in 1..{MAX_WIDTH}")
        if scope not in SCOPES:
            raise ValueError(f"unknown dedup scope: {scope!r}; expected one of {SCOPES}")
        if max_history is not None and max_history < 1:
            raise ValueError("max_history must be >= 1 or None")
        self.history[slot].fill_(PAD)
        self.table[slot].fill_(-1)
        self.length[slot] = 0
        self.generated[slot] = 0
        self.overflow[slot] = 0
        self.width[slot] = width
        self.scope[slot] = SCOPES.index(scope)
        self.max_history[slot] = -1 if max_history is None else min(max_history, 2**31 - 1)
        if scope == "all" and len(prompt):
            # The slot and the prompt in one pinned copy that does not wait for the stream
            # (the slot fields above are fills: no copy either): admission never synchronises.
            data = host_tensor([slot] + [int(t) for t in prompt], torch.int64, self.device)
            self.append(data[:1], data[1:].unsqueeze(0), generated=False)

    def open_many(self, slots: list[int], *, widths: list[int], scopes: list[str],
                  max_histories: list[int | None], prompts: list) -> None:
        """:meth:`open` for several requests at once (distinct slots): the same state, in a
        few launches for all of them (fills by index, one copy of their fields, one append
        of every scope-"all" prompt) instead of about ten each: admitting 256 requests
        opened 256 slots one by one."""
        if not slots:
            return
        if len(set(slots)) != len(slots):
            raise ValueError("open_many needs distinct slots")
        for width, scope, max_history in zip(widths, scopes, max_histories, strict=True):
            if not 1 <= width <= MAX_WIDTH:
                raise ValueError(f"context width must be in 1..{MAX_WIDTH}")
            if scope not in SCOPES:
                raise ValueError(f"unknown dedup scope: {scope!r}; expected one of {SCOPES}")
            if max_history is not None and max_history < 1:
                raise ValueError("max_history must be >= 1 or None")
        fields = host_tensor([list(slots), list(widths), [SCOPES.index(s) for s in scopes],
                              [-1 if m is None else min(m, 2**31 - 1) for m in max_histories]],
                             torch.int64, self.device)
        index = fields[0]
        self.history.index_fill_(0, index, PAD)
        self.table.index_fill_(0, index, -1)
        for column in (self.length, self.generated, self.overflow):
            column.index_fill_(0, index, 0)
        self.width.index_copy_(0, index, fields[1].to(self.width.dtype))
        self.scope.index_copy_(0, index, fields[2].to(self.scope.dtype))
        self.max_history.index_copy_(0, index, fields[3].to(self.max_history.dtype))
        rows = [(slot, [int(t) for t in prompt]) for slot, scope, prompt in zip(slots, scopes, prompts, strict=True)
                if scope == "all" and len(prompt)]
        if rows:
            widest = max(len(p) for _, p in rows)
            data = host_tensor([[slot, len(p)] + p + [0] * (widest - len(p)) for slot, p in rows], torch.int64,
                               self.device)
            self.append(data[:, 0], data[:, 2:], data[:, 1], generated=False)

    def append(self, slots: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor | None = None, *,
               generated: bool = True) -> None:
        """Commit tokens [B, N] (the first counts[b] of row b) to the requests in slots [B]."""
        slots = torch.as_tensor(slots, device=self.device).to(torch.int32).contiguous()
        tokens = torch.as_tensor(tokens, device=self.device)
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(1)
        tokens = tokens.to(torch.int64)
        if tokens.stride(-1) != 1:
            tokens = tokens.contiguous()
        if counts is None:
            counts = torch.full((slots.shape[0],), tokens.shape[1], dtype=torch.int32, device=self.device)
        counts = torch.as_tensor(counts, device=self.device).to(torch.int32).contiguous()
        if slots.shape[0] == 0:
            return
        launch.launch(_dedup_append_kernel, "dedup_append", (slots.shape[0],), (
            self.history, self.table, self.length, self.generated, self.width, self.scope, self.overflow, slots,
            tokens, tokens.stride(0), counts, self.capacity, self.table_size, int(generated)), options=DEDUP_OPTIONS)

    def repeated(self, slots: torch.Tensor, drafts: torch.Tensor | None = None) -> torch.Tensor:
        """Decisions [B, k + 1] (bool) for positions L .. L + k of each row's request, the
        block following drafts [B, k] (None: k = 0, the next token only)."""
        slots = torch.as_tensor(slots, device=self.device).to(torch.int32).contiguous()
        batch = slots.shape[0]
        if drafts is None:
            drafts = torch.zeros((batch, 0), dtype=torch.int64, device=self.device)
        drafts = torch.as_tensor(drafts, device=self.device).to(torch.int64)
        if drafts.stride(-1) != 1 and drafts.shape[1] > 1:
            drafts = drafts.contiguous()
        k = drafts.shape[1]
        out = torch.empty((batch, k + 1), dtype=torch.int8, device=self.device)
        if batch:
            launch.launch(_dedup_query_kernel, "dedup_query", (batch,), (
                self.history, self.table, self.length, self.generated, self.width, self.scope, self.max_history,
                slots, drafts, max(drafts.stride(0), 1), k, out, self.capacity, self.table_size),
                options=DEDUP_OPTIONS)
        return out.view(torch.bool)  # 0/1 bytes: a view, no conversion kernel

    def step(self, slots: torch.Tensor, commit: torch.Tensor, pending: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decode step in one launch: slots [B] (int64/int32), commit [B] (int8: append
        the slot's pending token first, one generated token), pending [slots] int64.
        Returns what the sampler reads for each row's next position: contexts [B, 16]
        int64 (PAD past the width), watermark [B] bool (the position is not repeated) and
        positions [B] int64 (generated tokens so far). Equal to ``append`` of the committed
        rows, then ``repeated`` and the history window, without their conversions."""
        batch = slots.shape[0]
        contexts = torch.empty((batch, MAX_WIDTH), dtype=torch.int64, device=self.device)
        marks = torch.empty(batch, dtype=torch.int8, device=self.device)
        positions = torch.empty(batch, dtype=torch.int64, device=self.device)
        if batch:
            launch.launch(_dedup_step_kernel, "dedup_step", (batch,), (
                self.history, self.table, self.length, self.generated, self.width, self.scope, self.max_history,
                self.overflow, slots, commit, pending, contexts, marks, positions, self.capacity, self.table_size),
                options=DEDUP_OPTIONS)
        return contexts, marks.view(torch.bool), positions

    def prepare_step(self, slots: torch.Tensor, commit: torch.Tensor, pending: torch.Tensor
                     ) -> tuple[launch.Prepared, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`step` bound once over fixed buffers, for a decode loop: returns
        ``(handle, contexts, watermark, positions)``; each ``handle()`` does what ``step(slots,
        commit, pending)`` does, writing into the returned (reused) outputs. ``slots`` (int32
        or int64), ``commit`` (int8) and ``pending`` are read at every call, so the caller
        updates them in place and keeps them alive; valid until the deduper grows."""
        batch = slots.shape[0]
        if batch == 0:
            raise ValueError("prepare_step needs at least one row")
        if commit.shape != (batch,) or commit.dtype != torch.int8 or not commit.is_contiguous():
            raise ValueError(f"commit must be a contiguous [{batch}] int8 tensor")
        if not slots.is_contiguous() or slots.dtype not in (torch.int32, torch.int64) or pending.dtype != torch.int64:
            raise ValueError("slots must be contiguous int32/int64 and pending int64")
        contexts = torch.empty((batch, MAX_WIDTH), dtype=torch.int64, device=self.device)
        marks = torch.empty(batch, dtype=torch.int8, device=self.device)
        positions = torch.empty(batch, dtype=torch.int64, device=self.device)
        handle = launch.Prepared(_dedup_step_kernel, "dedup_step", (batch,), (
            self.history, self.table, self.length, self.generated, self.width, self.scope, self.max_history,
            self.overflow, slots, commit, pending, contexts, marks, positions, self.capacity, self.table_size),
            options=DEDUP_OPTIONS)
        return handle, contexts, marks.view(torch.bool), positions
