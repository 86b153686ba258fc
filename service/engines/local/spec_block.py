"""The speculative group's blocks on static KV caches: one CUDA graph per (batch bucket,
draft inputs fed, column window) of the fixed-shape block function (block.py), captured at
load and replayed, pipelined ahead of the host.

Eagerly a block is about a hundred launches and as many host round trips per step;
captured, a step is: one host-to-device copy of the step's inputs (only after rows join or
leave: chained blocks read the inputs the last block wrote), one graph replay, four small
copies of the groups' new column counts and masks, and one read back (the one host
synchronisation). The host's side is flat in rows: inputs packed from the OutputTable's
arrays, tokens taken into it the same way, text made by the streamer thread.

Row parameters (keys, flags, widths, temperatures, dedup slots) are copied into the
bucket's buffers only when the group's membership changes (a new RowTable); the groups'
column counts and masks only when something other than the last block replaced them
(a join, a leave, a rollback).

Rows that filter by top-k or top-p need host-side decisions in ``process_logits``: such a
batch runs the same function eagerly, with the filters applied to its real rows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from service.engines.local.block import CONTEXT, Buffers, DedupRows, block, process_padded
from service.engines.local.outputs import RUNNING, STOPPED, OutputTable
from service.engines.local.request import RequestState
from service.engines.local.rows import HostDedup, RowTable
from service.engines.local.static_runner import BUCKETS, StaticGroup


@dataclass
class BlockCounts:
    graph_replays: int = 0
    eager_blocks: int = 0
    captures: int = 0
    skipped: int = 0
    """Chained launches not made: every row was sure to finish in the blocks in flight."""
    # Host seconds per phase of the steps (perf_counter, no synchronisation added): inputs
    # packed and copied; replay (or eager launches) returned; waiting for and reading back
    # the outputs; tokens taken (arrays), posted to the streamer, finished rows ended.
    seconds_prepare: float = 0.0
    seconds_launch: float = 0.0
    seconds_wait_read: float = 0.0
    seconds_take: float = 0.0


class SpeculativeBlocks:
    """The speculative group's blocks over StaticGroups: graph replays on CUDA (one per
    bucket x fed x window, captured at load), the same function eagerly elsewhere.

    The host side of a block is flat in rows: its inputs are packed from the engine's
    OutputTable with array operations, its tokens taken into it the same way, and its text
    made by the streamer thread; only rows that end (and rows with stop strings, which are
    taken one by one) cost Python per row."""

    def __init__(self, draft: StaticGroup, target: StaticGroup, k: int, outputs: OutputTable, streamer,
                 dedup_slots=None, graphs: bool = True, pipeline: bool = True, depth: int = 1) -> None:
        self.draft, self.target, self.k = draft, target, k
        self.outputs = outputs
        self.streamer = streamer
        self.device = target.device
        self.dedup_slots = dedup_slots  # rows.DedupSlots (CUDA) or None (HostDedup)
        self.graphs_enabled = graphs and self.device.type == "cuda" and dedup_slots is not None
        # Graph replays run ``depth`` blocks ahead of the host (step); pipeline False: each
        # block is taken before the call returns.
        self.pipeline = pipeline
        self.depth = depth
        self._inflight: deque[_InFlight] = deque()
        self.slots = min(draft.cache.slots, target.cache.slots)
        self._buffers: dict[int, Buffers] = {}
        self._graphs: dict[tuple[int, int, int], tuple] = {}
        self._stream = None
        self._pool = None
        self.counts = BlockCounts()

    # ------------------------------------------------------------------ buffers and graphs

    def _bucket(self, batch: int) -> int:
        if not self.graphs_enabled:
            return batch  # eager: exactly the rows (the CPU path pads nothing)
        return next(b for b in BUCKETS if b >= batch)

    def _bufs(self, bucket: int) -> Buffers:
        bufs = self._buffers.get(bucket)
        if bufs is None:
            dummy = self.dedup_slots.dummy if self.dedup_slots is not None else 0
            bufs = Buffers(bucket, self.k, self.draft, self.target, dummy, self.device)
            self._buffers[bucket] = bufs
        return bufs

    def _dedup(self, bufs: Buffers, dedup) -> DedupRows:
        if isinstance(dedup, HostDedup):
            return DedupRows(host=dedup)
        return DedupRows(self.dedup_slots.deduper, bufs.slots)

    def windows(self) -> tuple[int, ...]:
        return self.target.windows

    def _window(self, fed: int, ahead: int = 0) -> int:
        """The column window of a block; ``ahead``: blocks in flight before it, not taken yet
        (each advances a row by at most k + 1 columns in either cache)."""
        need = max(int(self.draft.lengths.max()) + fed + self.k, int(self.target.lengths.max()) + self.k + 2)
        need += ahead * (self.k + 1)
        return next((w for w in self.target.windows if w >= need), self.target.columns)

    def _graph_process(self, bufs: Buffers):
        def process(logits, repeat):
            temperature = bufs.temperature if repeat == 1 else bufs.temperature.repeat_interleave(repeat)
            real = bufs.real if repeat == 1 else bufs.real.repeat_interleave(repeat)
            return process_padded(logits, temperature, real)

        return process

    def _table_process(self, bufs: Buffers, table: RowTable, batch: int):
        """top-k/top-p rows: ``table.process`` on the real rows, zeros for padding rows."""

        def process(logits, repeat):
            vocab = logits.shape[-1]
            real = table.process(logits.view(bufs.bucket, repeat, vocab)[:batch].reshape(batch * repeat, vocab),
                                 repeat)
            return torch.nn.functional.pad(real, (0, 0, 0, (bufs.bucket - batch) * repeat))

        return process

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every (bucket, fed, window) graph, largest bucket first (the sampler's
        workspace then never grows after a capture that uses it)."""
        if not self.graphs_enabled:
            return
        from watermark.kernels import reduction

        dev = self.device
        self._stream = torch.cuda.Stream(dev)
        self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.stream(self._stream):
            reduction.workspace(dev, 1 << 14, 1 << 18, 1 << 22)  # ample for any bucket (1,024 x 5 rows): never regrown
        buckets = [b for b in BUCKETS if b <= self.slots]
        for bucket in reversed(buckets):
            for fed in (1, 2):
                for window in self.target.windows:
                    self._capture(bucket, fed, window)

    def _capture(self, bucket: int, fed: int, window: int):
        bufs = self._bufs(bucket)
        dedup = DedupRows(self.dedup_slots.deduper, bufs.slots)
        process = self._graph_process(bufs)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        # Warm-up outside the graph on the capture stream: no real rows (real 0), so nothing
        # is committed and only scratch columns are written.
        bufs.real.zero_()
        bufs.slots.fill_(bufs.slots_dummy)
        bufs.step.zero_()
        with torch.cuda.stream(stream):
            for _ in range(2):
                block(bufs, self.draft, self.target, self.k, fed, window, process, dedup)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            outputs = block(bufs, self.draft, self.target, self.k, fed, window, process, dedup)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        bufs.table = bufs.dedup = None  # rows must be reloaded (real was zeroed)
        bufs.d_state = bufs.t_state = None
        self._graphs[(bucket, fed, window)] = (graph, outputs)
        self.counts.captures += 1

    # ------------------------------------------------------------------ a step

    @torch.inference_mode()
    def step(self, rows: list[RequestState], table: RowTable, dedup) -> None:
        """One draft-then-verify block for every row (as ``scheduler.speculative_step``;
        ``table``: the rows' RowTable, whose ``out_rows`` are their OutputTable rows;
        ``dedup``: their rows.DeviceDedup, or HostDedup where no GPU deduper runs).

        Pipelined on CUDA graphs: a launched block is taken (read back, its tokens taken)
        by a later call, after that call has launched the following block, chained to it on
        the device (its inputs are the ones the last block wrote, see :func:`block`), so
        the GPU runs the next blocks while the host takes one. The groups' states
        (``next_pos``, ``valid``, ``lengths``) are those of the last block taken; the
        buffers run ahead. A row that finishes in a taken block has its chained blocks'
        tokens dropped (its dedup slot and cache row are closed or rewritten before anyone
        reads them) and the chained blocks are taken at once, so rows leave with nothing in
        flight; the engine calls :meth:`drain` before rows join or leave otherwise."""
        counts = self.counts
        t0 = time.perf_counter()
        inflight = self._inflight
        if inflight and inflight[0].table is not table:
            raise RuntimeError("rows joined or left with a speculative block in flight (drain first)")
        bucket = self._bucket(len(rows))
        bufs = self._bufs(bucket)
        plain = _graphable(table)
        if inflight and plain and bufs.table is table and bufs.dedup is dedup:
            launched, launching = False, 0.0
            while len(inflight) <= self.depth and not self._all_end_in_flight(table, len(inflight)):
                key = (bucket, 2, self._window(2, ahead=len(inflight)))
                chained = self._graphs.get(key) if key[2] < self.target.columns else None
                if chained is None:
                    break
                t1 = time.perf_counter()
                inflight.append(self._launch(chained, rows, table, 2, bufs))
                launching += time.perf_counter() - t1
                launched = True
            if launched or self._all_end_in_flight(table, len(inflight)):
                counts.skipped += not launched
                counts.seconds_launch += launching
                counts.seconds_prepare += time.perf_counter() - t0 - launching
                if self._take(inflight.popleft()):  # rows leave after this step: take the rest now
                    self.drain()
                return
        # Not chainable (top-k rows, the cache's end, new rows): take what is in flight first.
        while inflight:
            if self._take(inflight.popleft()):
                self.drain()
                return  # finished rows leave before the next block
        self._launch_packed(rows, table, dedup, bufs, bucket, plain, t0)

    def _all_end_in_flight(self, table: RowTable, blocks: int) -> bool:
        """Whether every row is sure to end within ``blocks`` blocks in flight (each takes
        at least one token from every row still running): then another block is waste."""
        if blocks == 0:
            return False
        rows = table.out_rows
        return bool(((self.outputs.max_tokens[rows] - self.outputs.length[rows]) <= blocks).all())

    def _launch_packed(self, rows, table, dedup, bufs, bucket, plain, t0) -> None:
        """A block whose inputs the host packs (after a join, a leave, a rollback, an eager
        batch): launched, then taken by a later call (graphs) or at once (eager)."""
        k, batch, counts = self.k, len(rows), self.counts
        if bufs.table is not table or bufs.dedup is not dedup:
            bufs.load_rows(table, dedup)
        host, fed = self._pack(table, bucket)
        if self.device.type == "cuda":
            host = host.pin_memory()
        bufs.step.copy_(host, non_blocking=True)
        bufs.d_state = bufs.load_group(self.draft, bufs.d_pos, bufs.d_valid, bufs.d_state)
        bufs.t_state = bufs.load_group(self.target, bufs.t_pos, bufs.t_valid, bufs.t_state)
        window = self._window(fed)
        key = (bucket, fed, window)
        t1 = time.perf_counter()
        if self.graphs_enabled and plain and key in self._graphs:
            launched = self._launch(self._graphs[key], rows, table, fed, bufs)
        else:
            process = self._graph_process(bufs) if plain else self._table_process(bufs, table, batch)
            outputs = block(bufs, self.draft, self.target, k, fed, window, process, self._dedup(bufs, dedup))
            launched = self._record(outputs, rows, table, fed, bufs)
            self.counts.eager_blocks += 1
            self.draft.eager_forwards += k
            self.target.eager_forwards += 1
        t2 = time.perf_counter()
        counts.seconds_prepare += t1 - t0
        counts.seconds_launch += t2 - t1
        if self.pipeline and launched.graph:
            self._inflight.append(launched)
        elif self._take(launched):
            self.drain()

    def _pack(self, table: RowTable, bucket: int) -> tuple[torch.Tensor, int]:
        """The block's inputs [bucket, 2 + CONTEXT + 4] from the OutputTable (as the block
        itself writes them for the next one: position, last token, the committed context
        right-aligned, the draft's pending inputs left-padded to two and which are live),
        and how many inputs the draft is fed (1 or 2)."""
        out, rows = self.outputs, table.out_rows
        count = out.pending_count[rows]
        two = count == 2
        values = np.zeros((bucket, 2 + CONTEXT + 4), dtype=np.int64)
        n = len(rows)
        values[:n, 0] = out.length[rows]
        values[:n, 1] = out.last_tokens(rows)
        values[:n, 2:2 + CONTEXT] = out.contexts(rows, table.widths_host, CONTEXT)
        values[:n, 2 + CONTEXT] = np.where(two, out.pending[rows, 0], 0)
        values[:n, 3 + CONTEXT] = np.where(two, out.pending[rows, 1], out.pending[rows, 0])
        values[:n, 4 + CONTEXT] = two
        values[:n, 5 + CONTEXT] = 1
        return torch.from_numpy(values), int(count.max())

    def _launch(self, captured, rows, table, fed: int, bufs: Buffers) -> _InFlight:
        graph, outputs = captured
        graph.replay()
        self.counts.graph_replays += 1
        self.draft.graph_replays += self.k
        self.target.graph_replays += 1
        launched = self._record(outputs, rows, table, fed, bufs)
        launched.graph = True
        return launched

    def _record(self, outputs, rows, table, fed: int, bufs: Buffers) -> _InFlight:
        """The block's outputs copied behind it: tokens into pinned memory (read by
        :meth:`_take`), the groups' new states into tensors of their own (a replay's outputs
        live in the graph's memory, which the next replay reuses)."""
        batch = len(rows)
        out_all, d_pos, d_valid, t_pos, t_valid = outputs
        states = (d_pos[:batch].clone(), d_valid[:batch].clone(), t_pos[:batch].clone(), t_valid[:batch].clone())
        out = out_all[:batch]
        if out.is_cuda:
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            host.copy_(out, non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(out.device))
        else:
            host, event = out.clone(), None
        return _InFlight(table, rows, fed, host, event, states, bufs)

    def _take(self, launched: _InFlight) -> bool:
        """Read a launched block back (the step's one synchronisation) and take its tokens
        for every row at once; the groups take its states. Returns whether any row has
        finished (rows already finished take nothing)."""
        k, fed, counts, out_table = self.k, launched.fed, self.counts, self.outputs
        t3 = time.perf_counter()
        # query() first: it holds the GIL, where synchronize() releases it even for a block
        # that has already finished, and taking it back from a streamer or event loop in the
        # middle of its Python costs up to the switch interval.
        if launched.event is not None and not launched.event.query():
            launched.event.synchronize()
        out = launched.host.numpy()
        t4 = time.perf_counter()
        self.draft.next_pos, self.draft.valid, self.target.next_pos, self.target.valid = launched.states
        launched.bufs.d_state = (self.draft.next_pos, self.draft.valid)
        launched.bufs.t_state = (self.target.next_pos, self.target.valid)
        accepted = out[:, -1]
        self.draft.lengths = self.draft.lengths + fed + k - 1 - np.maximum(0, k - 1 - accepted)
        self.target.lengths = self.target.lengths + accepted + 1
        rows = launched.table.out_rows
        done = out_table.done[rows]
        one_by_one = out_table.one_by_one[rows] & ~done
        fast = ~done & ~one_by_one
        tokens, routes, drawn = out[:, :k + 1], out[:, k + 1:2 * k + 2], out[:, 2 * k + 2:3 * k + 2]
        live = rows[~done]
        out_table.drafted[live] += k
        out_table.accepted[live] += accepted[~done]
        full = accepted == k  # all drafts accepted: the draft has not seen the last one nor the bonus
        last = np.take_along_axis(tokens, accepted[:, None], axis=1)[:, 0]
        out_table.set_pending(live, np.where(full, drawn[:, k - 1], last)[~done],
                              np.where(full, tokens[:, k], 0)[~done], np.where(full, 2, 1)[~done])
        finished = bool(done.any())
        index = np.flatnonzero(fast)
        if len(index):
            taken, why = out_table.take(rows[index], tokens[index], routes[index], accepted[index] + 1)
            self.streamer.block(launched.rows, index, tokens[index].copy(), taken,
                                out_table.routes[rows[index]].copy())
            for i in np.flatnonzero(why != RUNNING).tolist():
                launched.rows[index[i]].finish("stop" if why[i] == STOPPED else "length")
                finished = True
        for b in np.flatnonzero(one_by_one).tolist():
            a = int(accepted[b])
            if launched.rows[b].emit_block(tokens[b, :a + 1].tolist(), routes[b, :a + 1].tolist()):
                finished = True
        counts.seconds_wait_read += t4 - t3
        counts.seconds_take += time.perf_counter() - t4
        return finished

    def drain(self) -> None:
        """Take the blocks in flight, if any (before rows join or leave)."""
        while self._inflight:
            self._take(self._inflight.popleft())

    def abandon(self) -> None:
        """Forget the blocks in flight (a failed step: the engine restores the groups and the
        GPU deduper's history lengths; what the blocks wrote beyond them is rewritten)."""
        for launched in self._inflight:
            if launched.event is not None:
                launched.event.synchronize()
        self._inflight.clear()
        for bufs in self._buffers.values():  # they ran ahead: reload from the restored groups
            bufs.d_state = bufs.t_state = None


@dataclass
class _InFlight:
    """A launched block the host has not taken yet."""

    table: RowTable
    rows: list[RequestState]
    fed: int
    host: torch.Tensor
    """[B, 3k + 3] int64 (pinned on CUDA): tokens, routes, drafts, accepted."""
    event: object
    """The CUDA event after the copy into ``host`` (None off CUDA)."""
    states: tuple
    """The groups' states after the block: draft next_pos, valid, target next_pos, valid."""
    bufs: Buffers
    graph: bool = False


def _graphable(table: RowTable) -> bool:
    """The captured graphs serve the batch: no top-k/top-p rows and no 256-bit keys (the graphs
    are captured with the Philox kernels; a batch with 256-bit rows runs the same block
    eagerly, through the HMAC kernels)."""
    return table.wide is None and _unfiltered(table)


def _unfiltered(table: RowTable) -> bool:
    """No row filters by top-k or top-p (the captured graphs apply temperature only)."""
    params = table.params[1]
    return not any(kk > 0 for kk in params.top_k_values) and not params.uses_top_p
