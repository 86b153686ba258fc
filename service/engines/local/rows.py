"""A batch group's per-row sampling parameters on its device, and its dedup decisions.

Keys, temperatures and flags change only when requests join or leave, so a
:class:`RowTable` copies them to the device once per membership instead of rebuilding
them for every sampler call (about ten host-to-device copies each). What changes every
step (positions, contexts, the models' next inputs) the scheduler packs into one host
tensor, copied once per step.

Speculative drafts need each position's watermark context and dedup decision before the
next draft is drawn; both come from device tensors (:meth:`RowTable.block_contexts`,
:class:`DeviceDedup`), so the draft loop never waits for the GPU. On the CPU, where
reading a tensor costs nothing, :class:`HostDedup` asks each request's ContextDeduper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from service.engines.local.request import RequestState
from watermark.hmac_rows import WideRows, narrow_key, wide_rows
from watermark.prf import philox_torch
from watermark.processing import ProcessingParams, process_logits
from watermark.sampler import SamplerRows
from watermark.transfer import host_tensor, to_device


@dataclass(frozen=True)
class RowTable:
    """Rows [B] of one group in its order (``ids``); tensors [B] on ``device`` unless noted."""

    ids: tuple[str, ...]
    key_a: torch.Tensor
    key_b: torch.Tensor
    alpha: torch.Tensor
    no_alpha: torch.Tensor
    """zeros: speculative drafts draw dual-key rows under key A."""
    key_coin: torch.Tensor
    keyed_coin: torch.Tensor
    stream_keys: torch.Tensor
    watermarked: torch.Tensor
    greedy: torch.Tensor
    widths: torch.Tensor
    """int32 watermark context widths."""
    width: int
    """The widest context (host int): contexts are [B, width] tables."""
    params: dict[int, ProcessingParams]
    """Per repeat count (1, k + 1): temperature on the device, top-k/top-p on the host
    (process_logits checks those without a device read)."""
    context_index: torch.Tensor
    """[B, k + 1, width] int64: where lane i of position j's context sits in the step's
    sequence (committed context right-aligned in ``width`` columns, then the k drafts)."""
    lane_unused: torch.Tensor
    """[B, 1, width] bool: i >= widths[b] (lanes past a row's context, zeroed)."""
    out_rows: np.ndarray
    """[B] the rows' rows in the engine's OutputTable (-1 for a request not attached to one)."""
    widths_host: np.ndarray
    """[B] the context widths, on the host."""
    prompt_lengths: np.ndarray
    """[B] the rows' prompt tokens, on the host."""
    wide: WideRows | None = None
    """Rows with 256-bit keys (watermark.hmac_rows), or None."""

    @classmethod
    def build(cls, rows: list[RequestState], device: torch.device, k: int) -> RowTable:
        def dev(values, dtype):
            return host_tensor(values, dtype, device)

        widths = [r.width for r in rows]
        width = max(widths)

        def params(repeat: int) -> ProcessingParams:
            def col(values, dtype):
                return torch.tensor(values, dtype=dtype).repeat_interleave(repeat)

            # Built on the host and copied (repeat_interleave on the device may wait for it).
            return ProcessingParams(temperature=to_device(col([r.request.temperature for r in rows], torch.float32),
                                                          device),
                                    top_k=col([r.request.top_k for r in rows], torch.int64),
                                    top_p=col([r.request.top_p for r in rows], torch.float32))

        lane = torch.arange(width)
        index = (width + torch.arange(k + 1).view(1, -1, 1) - torch.tensor(widths).view(-1, 1, 1) + lane)
        return cls(
            ids=tuple(r.rid for r in rows),
            key_a=philox_torch.keys_tensor([narrow_key(r.keys, "key_a") for r in rows], device),
            key_b=philox_torch.keys_tensor([narrow_key(r.keys, "key_b") for r in rows], device),
            alpha=dev([r.keys.alpha for r in rows], torch.float32),
            no_alpha=torch.zeros(len(rows), dtype=torch.float32, device=device),
            key_coin=philox_torch.keys_tensor([narrow_key(r.keys, "key_coin") for r in rows], device),
            keyed_coin=dev([r.keyed_coin for r in rows], torch.bool),
            stream_keys=philox_torch.keys_tensor([r.stream_key for r in rows], device),
            watermarked=dev([r.watermarked for r in rows], torch.bool),
            greedy=dev([r.greedy for r in rows], torch.bool),
            widths=dev(widths, torch.int32),
            width=width,
            params={1: params(1), k + 1: params(k + 1)},
            context_index=to_device(index.clamp(max=width + k - 1), device),
            lane_unused=to_device(lane.view(1, 1, -1) >= torch.tensor(widths).view(-1, 1, 1), device),
            out_rows=np.array([r.row for r in rows], dtype=np.int64),
            widths_host=np.array(widths, dtype=np.int64),
            prompt_lengths=np.array([len(r.request.prompt_ids) for r in rows], dtype=np.int64),
            wide=wide_rows([r.keys for r in rows], device),
        )

    def process(self, logits: torch.Tensor, repeat: int = 1) -> torch.Tensor:
        """Raw logits [B * repeat, V] -> processed logits (temperature, top-k, top-p)."""
        return process_logits(logits, self.params[repeat])

    def sampler_rows(self, watermark: torch.Tensor, positions: torch.Tensor, routed: bool) -> SamplerRows:
        """The sampler's rows (contexts are passed as a table: dispatch.sample_padded)."""
        return SamplerRows(key_a=self.key_a, key_b=self.key_b, alpha=self.alpha if routed else self.no_alpha,
                           contexts=(), watermark=watermark, greedy=self.greedy, stream_keys=self.stream_keys,
                           positions=positions, wide=self.wide)

    def block_contexts(self, sequence: torch.Tensor, position: int | None = None) -> torch.Tensor:
        """Watermark contexts from ``sequence`` [B, width + k] (committed context right-aligned,
        then the drafts): [B, k + 1, width] for every position of the block, or [B, width] for
        one; lanes at or beyond a row's width are 0 (the padding of padded_contexts)."""
        index = self.context_index if position is None else self.context_index[:, position]
        batch = index.shape[0]
        table = sequence.gather(1, index.reshape(batch, -1)).view(index.shape)
        return table.masked_fill(self.lane_unused if position is None else self.lane_unused[:, 0], 0)


def right_aligned(context: tuple[int, ...], width: int) -> list[int]:
    """A row's committed context in ``width`` columns, right-aligned (see RowTable)."""
    return [0] * (width - len(context)) + list(context)


class HostDedup:
    """Dedup decisions from each request's ContextDeduper (drafts read back: the CPU path)."""

    def __init__(self, rows: list[RequestState]) -> None:
        self.rows = rows

    def at(self, drafts: torch.Tensor, position: int) -> torch.Tensor:
        """Whether position ``position`` of the block repeats a context: [B] bool (drafts [B, k],
        the first ``position`` columns drawn)."""
        drawn = drafts[:, :position].tolist()
        return torch.tensor([r.dedup.block_repeated(d)[position] for r, d in zip(self.rows, drawn)],
                            dtype=torch.bool, device=drafts.device)

    def block(self, drafts: torch.Tensor) -> torch.Tensor:
        """Decisions [B, k + 1] for every position of the block."""
        return torch.tensor([r.dedup.block_repeated(d) for r, d in zip(self.rows, drafts.tolist())],
                            dtype=torch.bool, device=drafts.device)

    def commit(self, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Nothing: a request's ContextDeduper takes its tokens as they are emitted."""


class DeviceDedup:
    """The same decisions from the GPU deduper (watermark/kernels/dedup.py), whose slots hold
    each request's history: nothing is read back."""

    def __init__(self, deduper, slots: torch.Tensor) -> None:
        self.deduper, self.slots = deduper, slots

    def at(self, drafts: torch.Tensor, position: int) -> torch.Tensor:
        # Later columns of ``drafts`` are not drawn yet; they only affect later positions.
        return self.deduper.repeated(self.slots, drafts)[:, position]

    def block(self, drafts: torch.Tensor) -> torch.Tensor:
        return self.deduper.repeated(self.slots, drafts)

    def commit(self, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Append each row's first ``counts[b]`` tokens [B, n] (what it emits; a row that
        finishes early leaves the batch, so its extra entries are never read)."""
        self.deduper.append(self.slots, tokens, counts)


class DedupSlots:
    """GPU deduper slots for the speculative group's requests (one per running request)."""

    def __init__(self, slots: int, capacity: int, device: torch.device) -> None:
        from watermark.kernels.dedup import GpuDeduper

        # One more slot than requests: the dummy that padding rows of a batch bucket point
        # at (they commit nothing; no request's history is ever read or written through it).
        self.deduper = GpuDeduper(slots + 1, capacity, device)
        self.dummy = slots
        self.free = list(range(slots))
        self.slot_of: dict[str, int] = {}

    def open(self, state: RequestState) -> None:
        """Give a request a slot holding its history so far (prompt for scope all, then its
        first generated token)."""
        slot = self.free.pop(0)
        self.slot_of[state.rid] = slot
        d = state.dedup
        self.deduper.open(slot, width=d.width, scope=d.scope, max_history=d.max_history,
                          prompt=state.request.prompt_ids if d.scope == "all" else ())
        if state.length:
            tokens = host_tensor([state.output], torch.int64, self.deduper.device)
            self.deduper.append(host_tensor([slot], torch.int32, self.deduper.device), tokens)

    def open_many(self, states: list[RequestState]) -> None:
        """:meth:`open` for each of ``states`` in order (the same slots and histories), in a
        few launches for all of them: admission opens a whole round's requests at once."""
        if not states:
            return
        if len(states) > len(self.free):
            raise IndexError("no free dedup slot")
        slots, self.free = self.free[:len(states)], self.free[len(states):]
        for state, slot in zip(states, slots):
            self.slot_of[state.rid] = slot
        dedups = [state.dedup for state in states]
        self.deduper.open_many(slots, widths=[d.width for d in dedups], scopes=[d.scope for d in dedups],
                               max_histories=[d.max_history for d in dedups],
                               prompts=[s.request.prompt_ids if d.scope == "all" else () for s, d in zip(states, dedups)])
        rows = [(slot, state.output) for slot, state in zip(slots, states) if state.length]
        if rows:
            widest = max(len(out) for _, out in rows)
            data = host_tensor([[slot, len(out)] + list(out) + [0] * (widest - len(out)) for slot, out in rows],
                               torch.int64, self.deduper.device)
            self.deduper.append(data[:, 0], data[:, 2:], data[:, 1])

    def close(self, rid: str) -> None:
        slot = self.slot_of.pop(rid, None)
        if slot is not None:
            self.free.append(slot)

    def resync(self, states: list[RequestState]) -> None:
        """Set each open request's history length back to the tokens its RequestState has
        taken: after a step rolled back once its block had committed on the device, the
        retried step would otherwise commit the same tokens a second time. (The hash
        entries the undone commit inserted are rewritten, at the same positions, when the
        retried step commits the same tokens: a block's draws depend only on the request.)"""
        slots, lengths, generated = [], [], []
        for state in states:
            slot = self.slot_of.get(state.rid)
            if slot is None:
                continue
            prompt = len(state.request.prompt_ids) if state.dedup.scope == "all" else 0
            slots.append(slot)
            lengths.append(min(prompt + state.length, self.deduper.capacity))
            generated.append(state.length)
        if slots:
            device = self.deduper.device
            index = host_tensor(slots, torch.int64, device)
            self.deduper.length[index] = host_tensor(lengths, torch.int32, device)
            self.deduper.generated[index] = host_tensor(generated, torch.int32, device)

    def for_rows(self, rows: list[RequestState]) -> DeviceDedup:
        return DeviceDedup(self.deduper, host_tensor([self.slot_of[r.rid] for r in rows], torch.int32,
                                                     self.deduper.device))
