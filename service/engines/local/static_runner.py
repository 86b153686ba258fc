"""A batch group over a static, preallocated KV cache (service/engines/local/model), with
CUDA-graph replay of its decode and verify forwards per batch bucket.

Same interface as ``runner.Group`` (prefill, join, keep, forward, reject_tail), so the
scheduler is unchanged. Rows are cache slots 0..B-1 in ``ids`` order. A row's live tokens
occupy columns 0..n-1 and its position equals its column; placeholder inputs (``live`` 0)
are written to a scratch column no row attends to. Rejected drafts are always a row's
newest live columns, so rejecting them just moves the row's column count back: no holes,
no compaction. Only this step's columns are written in place; everything a rollback needs
(``ids``, ``next_pos``, ``valid``) is replaced, never written in place, so a snapshot of
references restores a failed step (later writes land beyond the restored live region).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from service.engines.local.model import StaticCache, forward as static_forward
from watermark.transfer import host_tensor, to_device

log = logging.getLogger("hallmark.engine.local")

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Column windows: a step reads only the first W columns of the cache (every live column of
# its rows lies below W - 1; column W - 1 is the window's scratch), so the indexer's scores,
# its top-k and the masks cost O(W), not O(context); attention visits each query's own
# columns only. No result depends on W (model/attention.py): a request's tokens are the
# same whichever window its batch's longest row picks.
WINDOWS = (128, 256, 512, 1024)
# Prompt lengths whose prefill is a CUDA graph (a prompt is padded to the next one; longer
# prompts run eagerly). An eager prefill of the bundled target took ~9 ms on the H200:
# 16 requests arriving together spent ~0.3 s there, as long as their whole decode.
PREFILL_LENGTHS = (16, 32, 64, 128, 256, 512)
# Padded tokens of one batched prefill at most (rows x length): the matmuls then have at
# most as many rows as a verify step of the largest checked bucket has (256 x (k + 1)).
PREFILL_TOKENS = 1280


class StaticGroup:
    def __init__(self, model, device: torch.device, slots: int, context: int, graphs: bool) -> None:
        self.model, self.device = model, device
        self.columns = context + 2  # + the scratch column, + one spare
        self.scratch = self.columns - 1
        dtype = next(model.parameters()).dtype
        self.cache = StaticCache.for_model(model, slots, self.columns, device, dtype)
        self.ids: list[str] = []
        self.next_pos = torch.zeros((0,), dtype=torch.int64, device=device)  # [B] live tokens = next column
        self.valid = torch.zeros((0, self.columns), dtype=torch.bool, device=device)  # [B, T]
        self.lengths = np.zeros(0, dtype=np.int64)  # per row, an upper bound of its live tokens (host-side)
        self.windows = tuple(w for w in WINDOWS if w < self.columns) + (self.columns,)
        self.graphs_enabled = graphs and device.type == "cuda"
        self.batched_prefill = False  # prefill_many at admission (check_batched_prefill)
        self._graphs: dict[tuple[int, int], tuple] = {}
        self.eager_forwards = self.graph_replays = self.compactions = 0
        self.indexer_layers = model.config.num_hidden_layers if model.config.model_type == "deepseek_v32" else 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def mask(self) -> torch.Tensor:
        return self.valid

    def occupancy(self) -> tuple[int, int, int]:
        """(live KV tokens, allocated KV tokens, layers caching indexer keys)."""
        valid = self.valid  # a reference: consistent even mid-step
        return int(valid.sum()), self.cache.slots * self.columns, self.indexer_layers

    # ------------------------------------------------------------------ rows

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], padded: bool | None = None, ahead: int = 0):
        """Run one prompt alone into the next free slot (``ahead``: the slot after that many
        prefills that have not joined yet, see :meth:`join_many`); returns (slot, valid
        [1, T], last logits [V] float32). ``padded`` (default: where a prefill graph exists)
        pads the prompt to the next of PREFILL_LENGTHS and runs it as the decode steps do
        (padding inputs write only the scratch column), replayed as a CUDA graph on CUDA."""
        row = len(self.ids) + ahead
        if row >= self.cache.slots:
            raise RuntimeError(f"the static KV cache has {self.cache.slots} slots, all in use")
        if len(prompt_ids) >= self.scratch:
            raise ValueError(f"the prompt ({len(prompt_ids)} tokens) does not fit the static cache")
        n = len(prompt_ids)
        valid = torch.zeros((1, self.columns), dtype=torch.bool, device=self.device)
        valid[0, :n] = True
        length = next((m for m in PREFILL_LENGTHS if m >= n), None)
        if padded is None:
            padded = self.graphs_enabled and (length, None) in self._graphs
        if padded and length is not None and self._window(length) < self.columns:
            inputs = host_tensor([list(prompt_ids) + [0] * (length - n), [1] * n + [0] * (length - n), [row] * length],
                                 torch.int64, self.device)
            key = (length, None)
            if key in self._graphs:
                graph, (ids_buf, live_buf, slot_buf), outputs = self._graphs[key]
                ids_buf.copy_(inputs[0:1])
                live_buf.copy_(inputs[1:2])
                slot_buf.copy_(inputs[2, :1])
                graph.replay()
                self.graph_replays += 1
            else:
                self.eager_forwards += 1
                outputs = _prefill_step(self.model, self.cache, inputs[0:1], inputs[1:2], inputs[2, :1],
                                        self._window(length))
            # A copy: the graph's output buffer is the next replay's (admission prefills back to back).
            return row, valid, outputs[0, n - 1].to(torch.float32, copy=True)
        ids = torch.tensor([prompt_ids], dtype=torch.int64, device=self.device)
        cols = torch.arange(n, device=self.device).unsqueeze(0)
        self.eager_forwards += 1
        logits = static_forward(self.model, _Rows(self.cache, row, self.columns), ids, cols, cols, valid)
        return row, valid, logits[0, -1].float()

    @torch.inference_mode()
    def prefill_many(self, prompts: list[list[int]], ahead: int = 0) -> list[tuple]:
        """:meth:`prefill` for several prompts in one forward (rows padded to the next of
        PREFILL_LENGTHS, into the next free slots in order, ``ahead`` as there), eagerly:
        one launch of each kernel for all of them instead of one prefill graph each. Each
        row's logits equal its own prefill's where every kernel is row-invariant, which
        :func:`check_batched_prefill` tests bit for bit on this device, for every shape
        admission can give it, before the engine uses it."""
        first = len(self.ids) + ahead
        count, longest = len(prompts), max(len(p) for p in prompts)
        length = next((m for m in PREFILL_LENGTHS if m >= longest), None)
        if first + count > self.cache.slots:
            raise RuntimeError(f"the static KV cache has {self.cache.slots} slots, all in use")
        if length is None or self._window(length) >= self.columns:
            raise ValueError(f"prompts of {longest} tokens are prefilled one by one")
        ids = [list(p) + [0] * (length - len(p)) for p in prompts]
        live = [[1] * len(p) + [0] * (length - len(p)) for p in prompts]
        inputs = host_tensor(ids + live, torch.int64, self.device)
        zeros = torch.zeros((count,), dtype=torch.int64, device=self.device)
        none = torch.zeros((count, self.columns), dtype=torch.bool, device=self.device)
        logits, _, valid = _step(self.model, self.cache, inputs[:count], inputs[count:], zeros, none,
                                 self._window(length), first=first)
        self.eager_forwards += 1
        lengths = host_tensor([len(p) - 1 for p in prompts], torch.int64, self.device)
        last = logits.gather(1, lengths.view(-1, 1, 1).expand(-1, 1, logits.shape[-1]))[:, 0].to(torch.float32)
        return [(first + b, valid[b:b + 1], last[b]) for b in range(count)]

    def _window(self, length: int) -> int:
        """The column window of a prefill padded to ``length`` (its scratch column above it)."""
        return next((w for w in self.windows if w >= length + 1), self.columns)

    def join(self, request_id: str, slot, valid: torch.Tensor, next_pos: int) -> None:
        if slot != len(self.ids):
            raise RuntimeError("a prefilled slot must join before the next prefill")
        self.ids = self.ids + [request_id]
        self.lengths = np.append(self.lengths, next_pos)
        self.next_pos = torch.cat([self.next_pos, host_tensor([next_pos], torch.int64, self.device)])
        self.valid = torch.cat([self.valid, valid])

    def join_many(self, request_ids: list[str], slots: list, valids: list[torch.Tensor], next_pos: list[int]) -> None:
        """:meth:`join` for several prefills in slot order, with one copy each of the rows'
        positions and masks."""
        if list(slots) != list(range(len(self.ids), len(self.ids) + len(slots))):
            raise RuntimeError("prefilled slots must join in order, before the next prefill")
        self.ids = self.ids + list(request_ids)
        self.lengths = np.append(self.lengths, next_pos)
        self.next_pos = torch.cat([self.next_pos, host_tensor(next_pos, torch.int64, self.device)])
        self.valid = torch.cat([self.valid, *valids])

    def keep(self, keep_ids: list[str]) -> None:
        """Drop every row not in ``keep_ids`` (order preserved); kept rows move to slots 0..n-1."""
        if keep_ids == self.ids:
            return
        where = {rid: i for i, rid in enumerate(self.ids)}
        rows = [where[i] for i in keep_ids]
        if rows:
            index = host_tensor(rows, torch.int64, self.device)
            if rows != list(range(len(rows))):
                for layer in self.cache.layers:
                    for tensor in layer.values():
                        tensor[:len(rows)] = tensor.index_select(0, index)
            self.next_pos = self.next_pos.index_select(0, index)
            self.valid = self.valid.index_select(0, index)
        else:
            self.next_pos = self.next_pos[:0]
            self.valid = self.valid[:0]
        self.lengths = self.lengths[rows]
        self.ids = list(keep_ids)

    def snapshot(self):
        return (list(self.ids), self.next_pos, self.valid, self.lengths.copy())

    def restore(self, saved) -> None:
        self.ids, self.next_pos, self.valid, self.lengths = saved

    # ------------------------------------------------------------------ steps

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, n] (live [B, n] marks real inputs) -> logits [B, n, V] float32."""
        batch, n = input_ids.shape
        if live is None:
            live = torch.ones_like(input_ids)
        live = live.to(torch.int64)
        need = int(self.lengths.max()) + n + 1  # live columns below W - 1 after this step
        window = next((w for w in self.windows if w >= need), self.columns)
        self.lengths = self.lengths + n
        bucket = next((b for b in BUCKETS if b >= batch), None)
        if self.graphs_enabled and bucket is not None and bucket <= self.cache.slots:
            logits, next_pos, valid = self._replay(bucket, window, input_ids, live)
            self.graph_replays += 1
        else:
            logits, next_pos, valid = _step(self.model, self.cache, input_ids, live, self.next_pos, self.valid, window)
            self.eager_forwards += 1
        # Copies: a replay's outputs live in the graph's buffers, which the next replay overwrites.
        self.next_pos, self.valid = next_pos[:batch].clone(), valid[:batch].clone()
        return logits[:batch].float()

    def _replay(self, bucket: int, window: int, input_ids, live):
        batch, n = input_ids.shape
        key = (bucket, n, window)
        if key not in self._graphs:
            self._graphs[key] = self._capture(bucket, n, window)
        graph, (ids_buf, live_buf, pos_buf, valid_buf), outputs = self._graphs[key]
        if batch < bucket:  # padding rows: no live input (they write only the scratch column)
            ids_buf[batch:].zero_()
            live_buf[batch:].zero_()
        ids_buf[:batch].copy_(input_ids)
        live_buf[:batch].copy_(live)
        pos_buf[:batch].copy_(self.next_pos)
        valid_buf[:batch].copy_(self.valid)
        graph.replay()
        return outputs

    @torch.inference_mode()
    def capture_all(self, widths: tuple[int, ...]) -> None:
        """Capture the graphs of every bucket up to the slot count for these input widths."""
        for bucket in BUCKETS:
            if bucket > self.cache.slots:
                break
            for n in widths:
                for window in self.windows:
                    if (bucket, n, window) not in self._graphs:
                        self._graphs[(bucket, n, window)] = self._capture(bucket, n, window)
        for length in PREFILL_LENGTHS:
            if (length, None) not in self._graphs and self._window(length) < self.columns:
                self._graphs[(length, None)] = self._capture_prefill(length)

    def _capture_prefill(self, length: int):
        dev = self.device
        ids = torch.zeros((1, length), dtype=torch.int64, device=dev)
        live = torch.zeros((1, length), dtype=torch.int64, device=dev)  # none live: only scratch is written
        slot = torch.zeros((1,), dtype=torch.int64, device=dev)
        window = self._window(length)
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):
                _prefill_step(self.model, self.cache, ids, live, slot, window)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = _prefill_step(self.model, self.cache, ids, live, slot, window)
        return graph, (ids, live, slot), outputs

    def _capture(self, bucket: int, n: int, window: int):
        dev = self.device
        ids = torch.zeros((bucket, n), dtype=torch.int64, device=dev)
        live = torch.zeros((bucket, n), dtype=torch.int64, device=dev)
        pos = torch.zeros((bucket,), dtype=torch.int64, device=dev)
        valid = torch.zeros((bucket, self.columns), dtype=torch.bool, device=dev)
        # Padding rows have no live input: they write only the scratch column.
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocations, lazy inits)
                _step(self.model, self.cache, ids, live, pos, valid, window)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = _step(self.model, self.cache, ids, live, pos, valid, window)
        return graph, (ids, live, pos, valid), outputs

    def reject_tail(self, counts: torch.Tensor, on_device: torch.Tensor | None = None) -> None:
        """Drop each row's newest ``counts[b]`` live tokens (rejected drafts): its column
        count moves back and those columns stop being valid; they are rewritten next step.
        ``counts`` [B] int64 is a host tensor; ``on_device``, the same counts already on the
        device (the scheduler's), spares a copy."""
        self.lengths = self.lengths - counts.numpy()  # host bounds
        next_pos = self.next_pos - (to_device(counts, self.device) if on_device is None else on_device)
        cols = torch.arange(self.columns, device=self.device).unsqueeze(0)
        self.valid = self.valid & (cols < next_pos.unsqueeze(1))
        self.next_pos = next_pos


def _prefill_step(model, cache, input_ids, live, slot, window: int):
    """A prompt [1, L] (live [1, L] marks its tokens) into cache row ``slot`` [1] (a tensor,
    so that one graph serves every slot); returns logits [1, L, V]."""
    next_pos = torch.zeros((1,), dtype=torch.int64, device=input_ids.device)
    valid = torch.zeros((1, cache.columns), dtype=torch.bool, device=input_ids.device)
    return _step(model, cache, input_ids, live, next_pos, valid, window, slot)[0]


def _step(model, cache, input_ids, live, next_pos, valid, window: int, slot=None, first: int = 0):
    """Fixed-shape step over the first ``window`` columns (column window - 1 is scratch):
    columns/positions from the rows' counts, valid updated, forward run.
    Returns (logits [B, n, V], next_pos [B], valid [B, T]) as new tensors. ``slot`` [1]
    (prefill, B = 1) writes that cache row instead of row 0; ``first``: rows from that one."""
    total = valid.shape[1]
    scratch = window - 1
    valid = valid[:, :window]
    rank = torch.cumsum(live, dim=1) - 1
    columns = torch.where(live > 0, next_pos.unsqueeze(1) + rank, torch.full_like(rank, scratch))
    positions = torch.where(live > 0, columns, torch.zeros_like(columns))
    written = torch.zeros_like(valid).scatter(1, columns, live > 0)
    written[:, scratch] = False
    valid = valid | written
    rows = _Rows(cache, first, window) if slot is None else _SlotRows(cache, slot, window)
    logits = static_forward(model, rows, input_ids, positions, columns, valid)
    return logits, next_pos + live.sum(dim=1), torch.nn.functional.pad(valid, (0, total - window))


class _Rows:
    """A StaticCache seen from slot ``first`` on (prefill writes a new request's slot alone),
    columns below ``window`` only."""

    def __init__(self, cache: StaticCache, first: int, window: int) -> None:
        self.cache, self.first, self.window = cache, first, window
        self._rows = None  # the row index of every write of this forward (one arange, not one per write)

    def write(self, layer: int, name: str, columns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        tensor = self.cache.layers[layer][name]
        batch = columns.shape[0]
        rows = self._rows
        if rows is None or rows.shape != columns.shape or rows.device != columns.device:
            rows = torch.arange(self.first, self.first + batch, device=columns.device).unsqueeze(1).expand_as(columns)
            self._rows = rows
        tensor.index_put_((rows, columns), values.to(tensor.dtype))
        return tensor[self.first:self.first + batch, :self.window]


class _SlotRows:
    """A StaticCache seen as the one row ``slot`` ([1] int64 tensor), columns below ``window``."""

    def __init__(self, cache: StaticCache, slot: torch.Tensor, window: int) -> None:
        self.cache, self.slot, self.window = cache, slot, window

    def write(self, layer: int, name: str, columns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        tensor = self.cache.layers[layer][name]
        tensor.index_put_((self.slot.view(1, 1).expand_as(columns), columns), values.to(tensor.dtype))
        return tensor[:, :self.window].index_select(0, self.slot)


def prefill_all(group, prompts: list[list[int]]) -> list[tuple]:
    """Each prompt's prefill into the group's next free slots, in order: (slot, valid [1, T],
    last logits [V] float32) each. Batched (:meth:`StaticGroup.prefill_many`, chunks of at
    most PREFILL_TOKENS padded tokens) where the group's check allowed it, else one by one
    (a dynamic group's prefill returns its own cache in place of a slot)."""
    out: list[tuple] = []
    chunk: list[list[int]] = []

    def flush() -> None:
        if chunk:
            out.extend(group.prefill_many(chunk, ahead=len(out)) if len(chunk) > 1 else
                       [group.prefill(chunk[0], ahead=len(out))])
            chunk.clear()

    for prompt in prompts:
        length = next((m for m in PREFILL_LENGTHS if m >= len(prompt)), None)
        if not getattr(group, "batched_prefill", False) or length is None:
            flush()
            out.append(group.prefill(prompt, ahead=len(out)))
            continue
        padded = max([length] + [next(m for m in PREFILL_LENGTHS if m >= len(p)) for p in chunk])
        if chunk and (len(chunk) + 1) * padded > PREFILL_TOKENS:
            flush()
        chunk.append(prompt)
    flush()
    return out


@torch.inference_mode()
def check_batched_prefill(group: StaticGroup, seed: int = 0) -> bool:
    """Whether :meth:`StaticGroup.prefill_many` gives every row its own prefill's logits, bit
    for bit, on this device, for every shape :func:`prefill_all` can give it: each padded
    length L of PREFILL_LENGTHS and each count 2 .. PREFILL_TOKENS / L of prompts (random
    ids, lengths 1 .. L, the first exactly L). Run at load, with no row joined (it writes
    free slots only); a few hundred forwards."""
    if len(group.ids):
        raise RuntimeError("check batched prefill before any row joins")
    g = torch.Generator().manual_seed(seed)
    vocab = group.model.config.vocab_size
    for length in PREFILL_LENGTHS:
        most = min(PREFILL_TOKENS // length, group.cache.slots)
        if most < 2 or group._window(length) >= group.columns:
            continue
        lengths = [length] + torch.randint(1, length + 1, (most - 1,), generator=g).tolist()
        prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
        alone = [group.prefill(p, ahead=i)[2] for i, p in enumerate(prompts)]
        for count in range(2, most + 1):
            together = group.prefill_many(prompts[:count])
            if not all(torch.equal(alone[i], together[i][2]) for i in range(count)):
                log.warning("batched prefill changes logits (%d prompts of up to %d tokens); prefilling one by one",
                            count, length)
                return False
    return True
