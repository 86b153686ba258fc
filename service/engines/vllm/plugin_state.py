"""The vLLM plugin's per-request state, kept between steps in arrays, and its decode step.

Nothing here imports vLLM, pydantic or the key store: :mod:`.logits_processor` resolves a
request's key and hands this module plain values. Every request gets a *slot* (its row in
the arrays below and in the deduper) for its whole life; vLLM's row index is only a map
row -> slot, so vLLM condensing its batch moves nothing but that map.

One step (:meth:`PluginState.step`), with no Python loop over rows:

1. **Sync.** The token vLLM appended to a watermarked row is the one the plugin drew the
   step before (the row came back one-hot), so it is committed from the plugin's own
   record: the output lists are only measured (``map(len, ...)``) and their last entries
   compared, both C-level iterations. A row whose list grew otherwise (a greedy step, a
   resumed request, an in-flight placeholder) takes the slow path, alone.
2. **Dedup and contexts** for every row at once: the compiled CPU deduper
   (:mod:`watermark.cpu_dedup`) or, on CUDA, one launch of the GPU deduper's step
   (:meth:`watermark.kernels.dedup.GpuDeduper.step`), which also commits the tokens found
   in step 1 from the device's copy of the last draw (the host sends only the commit flags).
3. **Draw**: on CUDA the fused Triton sampler (routing, context states and the race in one
   launch); on the CPU the compiled race (:mod:`watermark.cpu_race`), whose logit pruning
   skips Philox only where a row is peaked or masked (free where it does not pay).
4. **One-hot write-back** of the drawn rows.
"""

from __future__ import annotations

import itertools
import logging
import operator
import time
from dataclasses import dataclass

import numpy as np
import torch

from watermark import cpu_dedup, cpu_race, prf, stream  # prf: key conventions (to_signed64)
from watermark.processing import MIN_TEMPERATURE, ProcessingParams, process_logits

log = logging.getLogger("hallmark.vllm")

PLACEHOLDER = -1  # vLLM's output entry for a token still in flight (async scheduling)
_LAST = operator.itemgetter(-1)


@dataclass(frozen=True)
class RequestSpec:
    """What a watermarked request needs, resolved once when it joins the batch."""

    key_a: int
    key_b: int
    alpha: float
    stream_key: int
    width: int
    scope: str
    max_history: int | None
    temperature: float
    top_k: int
    top_p: float


def _signed(values: np.ndarray) -> np.ndarray:
    return values.view(np.int64)


class PluginState:
    """Slots of the watermarked (non-greedy) requests in vLLM's batch."""

    def __init__(self, device: torch.device, slots: int = 64, capacity: int = 4096, *,
                 kernels: bool | None = None) -> None:
        """``kernels``: the Triton path (GPU deduper, fused sampler); default on CUDA only
        (tests run it on the CPU through Triton's interpreter)."""
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" if kernels is None else kernels
        self.capacity = capacity
        self._allocate(slots)
        self.rows: dict[int, int] = {}  # vLLM row -> slot
        self.profile: dict | None = None  # set to {} to accumulate host seconds per phase
        self._dirty = True
        self._pending_copy: np.ndarray | None = None
        self._plan: _CudaPlan | None = None

    # ------------------------------------------------------------------ slots

    def _allocate(self, slots: int) -> None:
        self.slots = slots
        self.free = list(range(slots - 1, -1, -1))
        self.key_a = np.zeros(slots, np.uint64)
        self.key_b = np.zeros(slots, np.uint64)
        self.stream_key = np.zeros(slots, np.uint64)
        self.alpha = np.zeros(slots, np.float32)
        self.temperature = np.ones(slots, np.float32)
        self.top_k = np.zeros(slots, np.int64)
        self.top_p = np.ones(slots, np.float32)
        self.committed = np.zeros(slots, np.int64)  # generated tokens committed to the deduper
        self.pending = np.full(slots, -1, np.int64)  # the token drawn for the slot's next position
        self.stalled = np.zeros(slots, bool)
        self.outputs: list = [None] * slots
        if self.cuda:
            from watermark.kernels.dedup import GpuDeduper

            self.dedup = GpuDeduper(slots, self.capacity, self.device)
            self.keys_dev = torch.zeros((4, slots), dtype=torch.int64, device=self.device)  # a, b, stream, -
            self.alpha_dev = torch.zeros(slots, dtype=torch.float32, device=self.device)
            self.temperature_dev = torch.ones(slots, dtype=torch.float32, device=self.device)
            # The token drawn for each slot's next position, on the device: the step kernel
            # commits it from there (the host only decides which rows commit).
            self.pending_dev = torch.zeros(slots, dtype=torch.int64, device=self.device)
            pinned = self.device.type == "cuda"
            self._host_tokens = torch.empty(slots, dtype=torch.int64, pin_memory=pinned)
            self._host_commit = torch.zeros(slots, dtype=torch.int8, pin_memory=pinned)
            self._host_tokens_np = self._host_tokens.numpy()
            self._copied = torch.cuda.Event() if pinned else None
        else:
            self.dedup = cpu_dedup.CpuDeduper(slots, self.capacity)

    def _grow(self) -> None:
        """Double the slots, keeping every live request's state."""
        self._collect_pending()
        old = {name: getattr(self, name) for name in ("key_a", "key_b", "stream_key", "alpha", "temperature",
                                                       "top_k", "top_p", "committed", "pending", "stalled")}
        old_outputs, old_dedup, n = self.outputs, self.dedup, self.slots
        extra = {}
        if self.cuda:
            extra = {"keys_dev": self.keys_dev, "alpha_dev": self.alpha_dev, "temperature_dev": self.temperature_dev,
                     "pending_dev": self.pending_dev}
        self._allocate(2 * n)
        for name, values in old.items():
            getattr(self, name)[:n] = values
        for name, values in extra.items():
            getattr(self, name)[..., :n] = values
        self.outputs[:n] = old_outputs
        for name in ("history", "table", "length", "generated", "width", "scope", "max_history", "overflow"):
            getattr(self.dedup, name)[:n] = getattr(old_dedup, name)
        used = set(self.rows.values())
        self.free = [s for s in range(2 * n - 1, -1, -1) if s not in used]

    def add(self, row: int, spec: RequestSpec, prompt: list[int] | None, output: list[int]) -> None:
        self.remove(row)
        if not self.free:
            self._grow()
        slot = self.free.pop()
        self.rows[row] = slot
        self.key_a[slot], self.key_b[slot], self.stream_key[slot] = spec.key_a, spec.key_b, spec.stream_key
        self.alpha[slot], self.temperature[slot] = spec.alpha, spec.temperature
        self.top_k[slot], self.top_p[slot] = spec.top_k, spec.top_p
        self.committed[slot] = 0
        self.pending[slot] = -1
        self.stalled[slot] = False
        self.outputs[slot] = output
        self.dedup.open(slot, width=spec.width, scope=spec.scope, max_history=spec.max_history,
                        prompt=prompt or ())
        if self.cuda:
            keys = torch.tensor([prf.to_signed64(k) for k in (spec.key_a, spec.key_b, spec.stream_key)],
                                dtype=torch.int64)
            self.keys_dev[:3, slot] = keys.to(self.device)
            self.alpha_dev[slot] = spec.alpha
            self.temperature_dev[slot] = spec.temperature
        self._dirty = True

    def remove(self, row: int) -> None:
        slot = self.rows.pop(row, None)
        if slot is not None:
            self.outputs[slot] = None
            self.free.append(slot)
            self._dirty = True

    def move(self, a: int, b: int, swap: bool) -> None:
        slot_a = self.rows.pop(a, None)
        slot_b = self.rows.pop(b, None)
        if slot_a is not None:
            self.rows[b] = slot_a
        if slot_b is not None:
            if swap:
                self.rows[a] = slot_b
            else:  # b's request left the batch
                self.outputs[slot_b] = None
                self.free.append(slot_b)
        self._dirty = True

    def _index(self) -> None:
        """Row/slot arrays of the live requests (rebuilt only when the batch changed)."""
        if not self._dirty:
            return
        pairs = sorted(self.rows.items())
        self.row_index = np.array([r for r, _ in pairs], dtype=np.int64)
        self.slot_index = np.array([s for _, s in pairs], dtype=np.int64)
        self.lists = [self.outputs[s] for _, s in pairs]
        self.identity_rows = bool(len(pairs)) and bool((self.row_index == np.arange(len(pairs))).all())
        if self.cuda and len(pairs):
            # What stays fixed while the batch does: each row's slot, keys, alpha, temperature, width.
            self.row_index_dev = torch.from_numpy(self.row_index).to(self.device)
            slots_t = torch.from_numpy(self.slot_index).to(self.device)
            self.slot_index_dev = slots_t
            self.sel_keys = self.keys_dev.index_select(1, slots_t)
            self.sel_alpha = self.alpha_dev.index_select(0, slots_t)
            self.sel_temperature = self.temperature_dev.index_select(0, slots_t)
            self.sel_width = self.dedup.width.index_select(0, slots_t)
        self._plan = _CudaPlan(self) if self.cuda and len(pairs) else None
        self._dirty = False

    # ------------------------------------------------------------------ step

    def _collect_pending(self) -> None:
        """CUDA: last step's draws, copied to the host while vLLM finished that step."""
        if self._pending_copy is not None:
            slots = self._pending_copy
            self._copied.synchronize()
            self.pending[slots] = self._host_tokens_np[:len(slots)]
            self._pending_copy = None

    def _sync(self) -> None:
        """Commit the tokens vLLM appended since the last step (see the module docstring)."""
        self._collect_pending()
        slots, lists = self.slot_index, self.lists
        n = len(slots)
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=n)
        fresh = lengths - self.committed[slots]
        pending = self.pending[slots]
        fast = (fresh == 1) & (pending >= 0)
        if fast.any():
            lasts = np.fromiter(map(_LAST, itertools.compress(lists, fast)), dtype=np.int64)
            ok = lasts == pending[fast]
            fast[np.flatnonzero(fast)[~ok]] = False
        if self.cuda:  # committed on the device by the step kernel, from pending_dev
            self._host_commit[:n].numpy()[:] = fast
        elif fast.any():
            commit = slots[fast]
            self._append(commit, self.pending[commit])
        self.committed[slots[fast]] += 1
        self.pending[slots] = -1
        for i in np.flatnonzero((fresh != 0) & ~fast):  # rare: see the module docstring
            self._sync_slow(int(slots[i]))

    def _sync_slow(self, slot: int) -> None:
        output = self.outputs[slot]
        start = int(self.committed[slot])
        tokens = []
        for token in output[start:]:
            if token == PLACEHOLDER:
                if not self.stalled[slot]:
                    log.error("Hallmark: a request has an in-flight output token at sampling time; its "
                              "watermark context is incomplete")
                    self.stalled[slot] = True
                break
            tokens.append(int(token))
        if tokens:
            self._append(np.array([slot]), np.array([tokens], dtype=np.int64))
            self.committed[slot] += len(tokens)

    def _append(self, slots: np.ndarray, tokens: np.ndarray) -> None:
        if self.cuda:  # one host-to-device copy for slots and tokens
            tokens = np.asarray(tokens, dtype=np.int64).reshape(len(slots), -1)
            packed = torch.from_numpy(np.concatenate([np.asarray(slots, dtype=np.int64)[:, None], tokens], axis=1))
            packed = packed.to(self.device, non_blocking=True)
            self.dedup.append(packed[:, 0], packed[:, 1:])
        else:
            self.dedup.append(slots, tokens)

    def step(self, logits: torch.Tensor) -> None:
        """Draw every live request's token and make its row one-hot (in place)."""
        if not self.rows:
            return
        self._index()
        plan = self._plan
        if plan is not None and plan.max_row < logits.shape[0]:
            self._step_plan(logits, plan)
            return
        started = time.perf_counter() if self.profile is not None else 0.0
        self._sync()
        if self.profile is not None:
            self.profile["sync_s"] = self.profile.get("sync_s", 0.0) + time.perf_counter() - started
        # CUDA: the commits found by _sync are made here, whatever rows are sampled below.
        decided = self._dedup_step(logits.device) if self.cuda else None
        rows, slots = self.row_index, self.slot_index
        inside = rows < logits.shape[0]
        if not inside.all():
            rows, slots = rows[inside], slots[inside]
        if len(rows) == 0:
            return
        if self.cuda:
            self._step_cuda(logits, rows, slots, bool(inside.all()), decided)
        else:
            self._step_cpu(logits, rows, slots)

    def _processing(self, slots: np.ndarray, device) -> ProcessingParams | None:
        """Processing params when any row needs top-k / top-p (else the race takes T itself)."""
        if not ((self.top_k[slots] > 0).any() or (self.top_p[slots] < 1.0).any()):
            return None
        return ProcessingParams(temperature=torch.from_numpy(self.temperature[slots]).to(device),
                                top_k=torch.from_numpy(self.top_k[slots]).to(device),
                                top_p=torch.from_numpy(self.top_p[slots]).to(device))

    def _step_cpu(self, logits: torch.Tensor, rows: np.ndarray, slots: np.ndarray) -> None:
        # numpy views of vLLM's logits: no torch dispatch (or its thread pool) for small ops.
        array = logits.detach().numpy() if logits.dtype == torch.float32 else None
        params = self._processing(slots, logits.device)
        if params is not None:
            values = process_logits(logits[torch.from_numpy(rows)], params).numpy()
        else:
            values = array[rows] if array is not None else logits[torch.from_numpy(rows)].to(torch.float32).numpy()
            values = np.where(np.isnan(values), np.float32(-np.inf), values)
            temperature = np.maximum(self.temperature[slots], np.float32(MIN_TEMPERATURE))  # process_logits' clamp
            if (temperature != 1.0).any():  # IEEE float32 division, as process_logits
                with np.errstate(invalid="ignore", divide="ignore"):
                    values = values / temperature[:, None]
                values = np.where(np.isnan(values), np.float32(-np.inf), values)
        watermark = ~self.dedup.next_repeated(slots)
        contexts = self.dedup.contexts(slots)
        keys, states = cpu_race.row_states(
            self.key_a[slots], self.key_b[slots], self.alpha[slots], self.stream_key[slots], contexts,
            self.dedup.width[slots], watermark, self.committed[slots], stream.LANE_SAMPLE)
        tokens = cpu_race.race(values, keys, states)
        self.pending[slots] = tokens
        if array is not None:
            array[rows] = -np.inf
            array[rows, tokens] = 0.0
        else:
            index = torch.from_numpy(rows)
            logits[index] = float("-inf")
            logits[index, torch.from_numpy(tokens)] = 0.0

    def _dedup_step(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One launch for every live row: commit the pending token where _sync said so,
        decide the next position and read its context. The host only copies the commit
        flags (pinned, asynchronous)."""
        commit = self._host_commit[:len(self.slot_index)].to(device, non_blocking=True)
        return self.dedup.step(self.slot_index_dev, commit, self.pending_dev)

    def _step_cuda(self, logits: torch.Tensor, rows: np.ndarray, slots: np.ndarray, all_rows: bool,
                   decided: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """The fused sampler on the rows decided by _dedup_step, then the one-hot write-back."""
        from watermark.kernels.gumbel import gumbel_sample

        device = logits.device
        n = len(rows)
        contexts, watermark, positions = decided
        rows_t, slots_t = self.row_index_dev, self.slot_index_dev
        keys, alpha, temperature, width = self.sel_keys, self.sel_alpha, self.sel_temperature, self.sel_width
        if not all_rows:  # rows beyond this step's logits (vLLM never does this; kept correct, not fast)
            keep = torch.from_numpy(np.flatnonzero(self.row_index < logits.shape[0])).to(device)
            rows_t, slots_t = rows_t[keep], slots_t[keep]
            keys, alpha, temperature, width = keys[:, keep], alpha[keep], temperature[keep], width[keep]
            contexts, watermark, positions = contexts[keep], watermark[keep], positions[keep]
        identity = all_rows and self.identity_rows
        selected = logits[:n] if identity else logits.index_select(0, rows_t)
        params = self._processing(slots, device)
        if params is not None:
            selected = process_logits(selected, params)
            temperature = torch.ones_like(temperature)
        result = gumbel_sample(selected, temperature=temperature, key_a=keys[0], key_b=keys[1], alpha=alpha,
                               contexts=contexts, widths=width, watermark=watermark, stream_keys=keys[2],
                               positions=positions)
        tokens = result.tokens
        self.pending_dev.index_copy_(0, slots_t, tokens)
        if identity:
            logits[:n].fill_(float("-inf")).scatter_(1, tokens.unsqueeze(1), 0.0)
        else:
            logits.index_fill_(0, rows_t, float("-inf"))
            logits.index_put_((rows_t, tokens), torch.zeros((), dtype=logits.dtype, device=device))
        if self._copied is not None:  # copied to the host while vLLM finishes its step
            self._host_tokens[:n].copy_(tokens, non_blocking=True)
            self._copied.record()
            self._pending_copy = slots.copy()
        else:
            self.pending[slots] = tokens.numpy()

    # ------------------------------------------------------------------ the bound CUDA step

    def _sync_plan(self, plan: "_CudaPlan") -> None:
        """:meth:`_sync` for the bound step: the same decisions, written for the common case
        (every row grew by the token the plugin drew) in a handful of array operations."""
        self._collect_pending()
        slots, lists, n = plan.slots, plan.lists, plan.n
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=n)
        committed = self.committed[slots]
        pending = self.pending[slots]
        fast = (lengths == committed + 1) & (pending >= 0)
        if fast.all():  # no list is empty here
            fast = np.fromiter(map(_LAST, lists), dtype=np.int64, count=n) == pending
        elif fast.any():
            lasts = np.fromiter(map(_LAST, itertools.compress(lists, fast)), dtype=np.int64)
            fast[np.flatnonzero(fast)[lasts != pending[fast]]] = False
        plan.host_commit_np[:] = fast
        self.committed[slots] = committed + fast
        self.pending[slots] = -1
        slow = (lengths != committed) & ~fast
        if slow.any():  # rare: see the module docstring
            for i in np.flatnonzero(slow):
                self._sync_slow(int(slots[i]))

    def _step_plan(self, logits: torch.Tensor, plan: "_CudaPlan") -> None:
        """The CUDA step over the batch's bound buffers (:class:`_CudaPlan`): commit flags
        up, the deduper's step and the fused sampler through bound launches, the one-hot
        write-back, the draws down (asynchronously, collected at the next step)."""
        started = time.perf_counter() if self.profile is not None else 0.0
        self._sync_plan(plan)
        if self.profile is not None:
            self.profile["sync_s"] = self.profile.get("sync_s", 0.0) + time.perf_counter() - started
        n = plan.n
        plan.commit.copy_(plan.host_commit, non_blocking=True)
        plan.dedup()
        if self.identity_rows:
            target = logits if logits.shape[0] == n else logits[:n]
            selected = target
        else:
            selected = logits.index_select(0, self.row_index_dev)
        if plan.processing is not None:
            selected = process_logits(selected, plan.processing)
        tokens = plan.sample(selected)
        self.pending_dev.index_copy_(0, self.slot_index_dev, tokens)
        if self.identity_rows:
            target.fill_(float("-inf")).scatter_(1, plan.tokens2d, 0.0)
        else:
            logits.index_fill_(0, self.row_index_dev, float("-inf"))
            logits.index_put_((self.row_index_dev, tokens), torch.zeros((), dtype=logits.dtype, device=logits.device))
        if self._copied is not None:  # copied to the host while vLLM finishes its step
            plan.host_tokens.copy_(tokens, non_blocking=True)
            self._copied.record()
            self._pending_copy = plan.slots
        else:
            self.pending[plan.slots] = tokens.numpy()

    def warm_up(self) -> None:
        """Compile what the first step would (numba on the CPU), so no request pays for it."""
        if not self.cuda:
            cpu_race.warm_up()
            probe = cpu_dedup.CpuDeduper(1, 8)
            probe.open(0, width=2, scope="all", max_history=3, prompt=[1, 2])
            probe.append(np.array([0]), np.array([[3]]))
            probe.next_repeated(np.array([0]))
            probe.contexts(np.array([0]))


class _CudaPlan:
    """What the CUDA step reuses while vLLM's batch keeps its composition: the rows' slots
    and output lists, the device buffers the deduper's step writes and the sampler reads,
    and both kernels bound once (:class:`watermark.kernels.launch.Prepared`: no
    specialisation or argument binding in Triton's Python launcher per step). Rebuilt
    whenever the batch changes (``PluginState._index``)."""

    def __init__(self, state: PluginState) -> None:
        from watermark.kernels.gumbel import PreparedSample

        device = state.device
        self.slots = state.slot_index
        self.lists = state.lists
        self.n = n = len(self.slots)
        self.max_row = int(state.row_index.max())
        self.commit = torch.zeros(n, dtype=torch.int8, device=device)
        self.host_commit = state._host_commit[:n]
        self.host_commit_np = self.host_commit.numpy()
        self.host_tokens = state._host_tokens[:n]
        self.dedup, contexts, watermark, positions = state.dedup.prepare_step(state.slot_index_dev, self.commit,
                                                                              state.pending_dev)
        self.processing = state._processing(self.slots, device)
        temperature = state.sel_temperature
        if self.processing is not None:  # process_logits applies the temperature
            temperature = torch.ones_like(temperature)
        self.sample = PreparedSample(temperature=temperature, key_a=state.sel_keys[0], key_b=state.sel_keys[1],
                                     alpha=state.sel_alpha, contexts=contexts, widths=state.sel_width,
                                     watermark=watermark, stream_keys=state.sel_keys[2], positions=positions)
        self.tokens2d = self.sample.tokens.unsqueeze(1)
