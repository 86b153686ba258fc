"""One speculative block as a function of fixed shapes: what the CUDA graphs capture.

A block (see ``scheduler.speculative_step``, the CPU path, whose tokens this one gives) is
the draft model's k forwards with the watermarked draws between them (dedup decisions,
contexts, sampler), the target's verify forward, the verification kernel, the dedup
commit and both caches' rejected tails, over one batch bucket's static buffers. Rows are
padded to the bucket: padding rows have no live input (their forwards write only the
scratch column), their logits are replaced by zeros before every draw (finite
probabilities for the kernels, tokens in range), they commit nothing to the deduper (they
point at a dummy slot) and nothing they produce is read. Every kernel computes each row
alone, so a real row's tokens do not depend on the padding. spec_block.py runs it.
"""

from __future__ import annotations

import torch

from service.engines.local.rows import RowTable
from service.engines.local.static_runner import StaticGroup, _step
from watermark import dispatch, stream
from watermark.hmac_rows import WideRows
from watermark.processing import MIN_TEMPERATURE
from watermark.sampler import SamplerRows
from watermark.speculative import VerifyRows

CONTEXT = 16
"""Context columns of the step's table (the widest watermark context, MAX_CONTEXT_WIDTH):
fixed, so that a graph serves every mix of context widths."""


class Buffers:
    """One bucket's static inputs (and the groups' state between blocks)."""

    def __init__(self, bucket: int, k: int, draft: StaticGroup, target: StaticGroup, dummy_slot: int,
                 device: torch.device) -> None:
        def z(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.bucket = bucket
        # Per row: position, last token, committed context (right-aligned), the draft
        # model's inputs (left-padded to two), which of them are live.
        self.step = z(bucket, 2 + CONTEXT + 4)
        self.key_a, self.key_b, self.key_coin, self.stream_keys = (z(bucket) for _ in range(4))
        self.keyed_coin, self.watermarked, self.greedy = (z(bucket, dtype=torch.bool) for _ in range(3))
        self.no_alpha = z(bucket, dtype=torch.float32)
        self.widths = torch.ones(bucket, dtype=torch.int32, device=device)
        self.temperature = torch.ones(bucket, dtype=torch.float32, device=device)
        self.real = z(bucket)  # 1 for a real row, 0 for padding
        self.slots_dummy = dummy_slot
        self.slots = torch.full((bucket,), dummy_slot, dtype=torch.int32, device=device)
        self.d_pos, self.d_valid = z(bucket), z(bucket, draft.columns, dtype=torch.bool)
        self.t_pos, self.t_valid = z(bucket), z(bucket, target.columns, dtype=torch.bool)
        self.wide = None  # the rows' 256-bit keys (hmac_rows.WideRows over the bucket), or None
        self.table = self.dedup = None  # the RowTable (and dedup) whose rows are in the buffers
        self.d_state = self.t_state = None  # the groups' (next_pos, valid) the buffers hold

    def load_rows(self, table: RowTable, dedup) -> None:
        n = len(table.ids)
        for buf, values in ((self.key_a, table.key_a), (self.key_b, table.key_b), (self.key_coin, table.key_coin),
                            (self.stream_keys, table.stream_keys), (self.keyed_coin, table.keyed_coin),
                            (self.watermarked, table.watermarked), (self.greedy, table.greedy),
                            (self.widths, table.widths), (self.temperature, table.params[1].temperature)):
            buf[:n].copy_(values)
        for buf, pad in ((self.key_a, 0), (self.key_b, 0), (self.key_coin, 0), (self.stream_keys, 0),
                         (self.keyed_coin, False), (self.watermarked, False), (self.greedy, False),
                         (self.widths, 1), (self.temperature, 1.0), (self.real, 0)):
            buf[n:].fill_(pad)
        self.real[:n].fill_(1)
        self.wide = _padded_wide(table.wide, self.bucket)
        slots = getattr(dedup, "slots", None)  # rows.DeviceDedup's; HostDedup has none
        if slots is not None:
            self.slots[:n].copy_(slots)
            self.slots[n:].fill_(self.slots_dummy)
        self.table, self.dedup = table, dedup

    def load_group(self, group: StaticGroup, pos: torch.Tensor, valid: torch.Tensor, state) -> tuple:
        if state is None or state[0] is not group.next_pos or state[1] is not group.valid:
            n = len(group.ids)
            pos[:n].copy_(group.next_pos)
            valid[:n].copy_(group.valid)
        return group.next_pos, group.valid


def _padded_wide(wide: WideRows | None, bucket: int) -> WideRows | None:
    """A table's 256-bit rows over a bucket (padding rows 64-bit, their midstates zero). Batches
    with such rows run their blocks eagerly (spec_block: the graphs are captured without them)."""
    if wide is None:
        return None
    pad = bucket - wide.wide.shape[0]

    def rows(x):
        return torch.nn.functional.pad(x, (0, 0, 0, pad)) if x.dim() == 2 else torch.nn.functional.pad(x, (0, pad))

    return WideRows(mids_a=rows(wide.mids_a), mids_b=rows(wide.mids_b), wide=rows(wide.wide),
                    mids_coin=None if wide.mids_coin is None else rows(wide.mids_coin))


def process_padded(logits: torch.Tensor, temperature: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``process_logits`` without top-k/top-p (the same operations), padding rows zeroed."""
    inf = float("inf")
    out = torch.nan_to_num(logits.to(torch.float32), nan=-inf, posinf=inf, neginf=-inf)
    divisor = torch.where(temperature == 0, torch.ones_like(temperature), temperature.clamp(min=MIN_TEMPERATURE))
    out = out / divisor.unsqueeze(-1)
    return out.masked_fill((real == 0).unsqueeze(-1), 0.0)


class DedupRows:
    """The block's dedup decisions and commit: the GPU deduper over the bucket's slots, or
    (CPU tests) a HostDedup over the real rows."""

    def __init__(self, deduper=None, slots=None, host=None) -> None:
        self.deduper, self.slots, self.host = deduper, slots, host

    def block(self, drafts: torch.Tensor) -> torch.Tensor:
        if self.host is not None:
            return self.host.block(drafts)
        return self.deduper.repeated(self.slots, drafts)

    def commit(self, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        if self.host is None:
            self.deduper.append(self.slots, tokens, counts)


def block(bufs: Buffers, draft: StaticGroup, target: StaticGroup, k: int, fed: int, window: int, process,
          dedup: DedupRows):
    """One speculative block over the bucket's buffers (fixed shapes, no host reads unless
    ``dedup`` is host-side). Returns (out [B, 3k + 3] int64: tokens, routes, drafts,
    accepted; draft next_pos, valid; target next_pos, valid), the caches' rejected tails
    already dropped; the new states are also written back into the buffers, and the next
    block's inputs into ``bufs.step``."""
    step = bufs.step
    batch = step.shape[0]
    positions = step[:, 0]
    sequence = torch.nn.functional.pad(step[:, 2:2 + CONTEXT], (0, k))  # context, then the drafts
    drafts = sequence[:, CONTEXT:]
    inputs, live = step[:, 2 + CONTEXT:4 + CONTEXT], step[:, 4 + CONTEXT:]
    real = bufs.real
    one = real.unsqueeze(1)
    # Where lane i of position j's context sits in ``sequence`` (lanes past a row's width: 0).
    lane = torch.arange(CONTEXT, device=step.device)
    widths = bufs.widths.to(torch.int64).view(-1, 1, 1)
    index = (CONTEXT + torch.arange(k + 1, device=step.device).view(1, -1, 1) - widths + lane).clamp(
        min=0, max=CONTEXT + k - 1)
    unused = lane.view(1, 1, -1) >= widths

    def contexts(j=None):
        idx = index if j is None else index[:, j]
        table = sequence.gather(1, idx.reshape(batch, -1)).view(idx.shape)
        return table.masked_fill(unused if j is None else unused[:, 0], 0)

    logits, d_pos, d_valid = _step(draft.model, draft.cache, inputs[:, 2 - fed:], live[:, 2 - fed:], bufs.d_pos,
                                   bufs.d_valid, window)
    logits = logits[:, -1]
    draft_probs = []
    for j in range(k):
        repeated = dedup.block(drafts)[:, j]  # later columns are not drawn yet: they affect later positions only
        processed = process(logits, 1)
        rows = SamplerRows(key_a=bufs.key_a, key_b=bufs.key_b, alpha=bufs.no_alpha, contexts=(),
                           watermark=bufs.watermarked & ~repeated, greedy=bufs.greedy,
                           stream_keys=bufs.stream_keys, positions=positions + j, wide=bufs.wide)
        result = dispatch.sample_padded(processed, rows, contexts(j), bufs.widths, lane=stream.LANE_DRAFT)
        draft_probs.append(torch.softmax(processed, dim=-1))
        drafts[:, j] = result.tokens
        if j < k - 1:
            logits, d_pos, d_valid = _step(draft.model, draft.cache, result.tokens.unsqueeze(1), one, d_pos, d_valid,
                                           window)
            logits = logits[:, -1]
    t_logits, t_pos, t_valid = _step(target.model, target.cache, torch.cat([step[:, 1:2], drafts], dim=1),
                                     one.expand(-1, k + 1), bufs.t_pos, bufs.t_valid, window)
    processed = process(t_logits.reshape(batch * (k + 1), -1), k + 1)
    target_probs = torch.softmax(processed, dim=-1).reshape(batch, k + 1, -1)
    repeated = dedup.block(drafts)
    verify_rows = VerifyRows(key_b=bufs.key_b, key_coin=bufs.key_coin, keyed_coin=bufs.keyed_coin, contexts=(),
                             watermark=bufs.watermarked.unsqueeze(1) & ~repeated, greedy=bufs.greedy,
                             stream_keys=bufs.stream_keys, positions=positions, wide=bufs.wide)
    result = dispatch.verify_padded(target_probs, torch.stack(draft_probs, dim=1), drafts, verify_rows, contexts(),
                                    bufs.widths)
    accepted = result.num_accepted
    dedup.commit(result.tokens, (accepted + 1) * real)
    # Target: last + k drafts were fed, keep last + accepted. Draft: pending + k - 1 drafts
    # were fed, keep up to the accepted drafts.
    t_pos = t_pos - (k - accepted) * real
    d_pos = d_pos - (k - 1 - accepted).clamp(min=0) * real
    t_valid = t_valid & (torch.arange(t_valid.shape[1], device=step.device) < t_pos.unsqueeze(1))
    d_valid = d_valid & (torch.arange(d_valid.shape[1], device=step.device) < d_pos.unsqueeze(1))
    for buf, value in ((bufs.t_pos, t_pos), (bufs.t_valid, t_valid), (bufs.d_pos, d_pos), (bufs.d_valid, d_valid)):
        buf.copy_(value)
    out = torch.cat([result.tokens, result.routes.to(torch.int64), drafts, accepted.unsqueeze(1)], dim=1)
    # The next block's inputs, as the host would pack them from the tokens taken (position,
    # last token, the last CONTEXT tokens right-aligned, the draft's pending inputs), so that
    # the next block can be launched before the host has read this one (chained launches).
    last = result.tokens.gather(1, accepted.unsqueeze(1))  # [B, 1]
    context = torch.cat([step[:, 2:2 + CONTEXT], result.tokens], dim=1).gather(1, accepted.unsqueeze(1) + 1 + lane)
    context = context.masked_fill(lane < CONTEXT - bufs.widths.to(torch.int64).unsqueeze(1), 0)
    full = (accepted == k).to(torch.int64).unsqueeze(1)  # all drafts accepted: two pending inputs
    pending = torch.cat([drafts[:, k - 1:k] * full, last, full, torch.ones_like(full)], dim=1)
    step.copy_(torch.cat([(positions + accepted + 1).unsqueeze(1), last, context, pending], dim=1) * one)
    return out, d_pos, d_valid, t_pos, t_valid
