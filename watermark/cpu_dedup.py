"""Batched context deduplication on the CPU, compiled (numba): the layout and rules of
:class:`watermark.kernels.dedup.GpuDeduper`, decisions of :class:`watermark.dedup.ContextDeduper`.

Per request slot: the token history behind MAX_WIDTH PAD entries (the context of position
p is one contiguous window) and an open-addressing table from a 64-bit hash of a context
to the *last* position holding it (verified entry by entry, so a collision costs a probe,
never a wrong answer); O(1) per token, whatever the history length. One call appends a
token to every row of a step and one answers every row's next-token decision: no Python
per row. ``capacity`` bounds a slot's history; appends beyond it are flagged in
``overflow`` (the caller then falls back to ContextDeduper for that request).
"""

from __future__ import annotations

import numpy as np

from watermark.dedup import PAD

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None

MAX_WIDTH = 16
SCOPES = ("none", "single_turn", "all")
_H1 = np.uint64(0x9E3779B97F4A7C15)
_H2 = np.uint64(0xBF58476D1CE4E5B9)
_H3 = np.uint64(0x94D049BB133111EB)


def _hash(hist, start, width):  # pragma: no cover - compiled
    h = np.uint64(0)
    for i in range(width):
        x = (np.uint64(np.uint32(hist[start + i])) + np.uint64(i + 1) * _H1) * _H2
        h += x ^ (x >> np.uint64(31))
    h = (h ^ (h >> np.uint64(29))) * _H3
    return h ^ (h >> np.uint64(32))


def _same(hist, a, b, width):  # pragma: no cover - compiled
    for i in range(width):
        if hist[a + i] != hist[b + i]:
            return False
    return True


def _append(history, table, length, generated, width, scope, overflow, slots, tokens, counts,
            generated_flag):  # pragma: no cover - compiled
    capacity = history.shape[1] - MAX_WIDTH
    tmask = table.shape[1] - 1
    for r in range(slots.shape[0]):
        slot = slots[r]
        hist = history[slot]
        tab = table[slot]
        w = width[slot]
        n = length[slot]
        for t in range(counts[r]):
            if n >= capacity:
                overflow[slot] = 1
                continue
            if scope[slot] != 0:
                start = MAX_WIDTH + n - w  # the context of position n
                i = np.int64(_hash(hist, start, w) & np.uint64(tmask))
                while True:
                    entry = tab[i]
                    if entry < 0 or _same(hist, MAX_WIDTH + entry - w, start, w):
                        tab[i] = n
                        break
                    i = (i + 1) & tmask
            hist[MAX_WIDTH + n] = tokens[r, t]
            n += 1
        length[slot] = n
        if generated_flag:
            generated[slot] += counts[r]


def _next_repeated(history, table, length, generated, width, scope, max_history, slots,
                   out):  # pragma: no cover - compiled
    tmask = table.shape[1] - 1
    for r in range(slots.shape[0]):
        slot = slots[r]
        w = width[slot]
        if scope[slot] == 0:
            out[r] = False
            continue
        if scope[slot] == 2 and generated[slot] < w:
            out[r] = True
            continue
        hist = history[slot]
        tab = table[slot]
        n = length[slot]
        start = MAX_WIDTH + n - w
        i = np.int64(_hash(hist, start, w) & np.uint64(tmask))
        found = -1
        while True:
            entry = tab[i]
            if entry < 0:
                break
            if _same(hist, MAX_WIDTH + entry - w, start, w):
                found = entry
                break
            i = (i + 1) & tmask
        out[r] = found >= 0 and (max_history[slot] < 0 or found >= n - max_history[slot])


def _contexts(history, length, generated, width, slots, out):  # pragma: no cover - compiled
    """Each row's watermark context: its last w generated tokens, PAD before the first."""
    for r in range(slots.shape[0]):
        slot = slots[r]
        w = width[slot]
        n = length[slot]
        g = generated[slot]
        for i in range(w):
            back = w - i  # 1 = the last token
            out[r, i] = history[slot, MAX_WIDTH + n - back] if back <= g else PAD


if numba is not None:
    _hash = numba.njit(cache=True, nogil=True, inline="always")(_hash)
    _same = numba.njit(cache=True, nogil=True, inline="always")(_same)
    _append = numba.njit(cache=True, nogil=True)(_append)
    _next_repeated = numba.njit(cache=True, nogil=True)(_next_repeated)
    _contexts = numba.njit(cache=True, nogil=True)(_contexts)


class CpuDeduper:
    """Context histories of up to ``slots`` concurrent requests (numpy arrays, numba loops)."""

    def __init__(self, slots: int, capacity: int) -> None:
        if slots < 1 or capacity < 1:
            raise ValueError("slots and capacity must be >= 1")
        self.capacity = capacity
        table_size = 1 << max(4, (2 * capacity - 1).bit_length())  # load factor <= 1/2
        self.history = np.full((slots, capacity + MAX_WIDTH), PAD, dtype=np.int64)
        self.table = np.full((slots, table_size), -1, dtype=np.int64)
        self.length = np.zeros(slots, dtype=np.int64)
        self.generated = np.zeros(slots, dtype=np.int64)
        self.width = np.ones(slots, dtype=np.int64)
        self.scope = np.zeros(slots, dtype=np.int8)
        self.max_history = np.full(slots, -1, dtype=np.int64)
        self.overflow = np.zeros(slots, dtype=np.int8)

    def open(self, slot: int, *, width: int, scope: str, max_history: int | None, prompt=()) -> None:
        """Start a request in ``slot`` (as ContextDeduper(width, scope, max_history, prompt))."""
        if not 1 <= width <= MAX_WIDTH:
            raise ValueError(f"context width must be in 1..{MAX_WIDTH}")
        if scope not in SCOPES:
            raise ValueError(f"unknown dedup scope: {scope!r}; expected one of {SCOPES}")
        self.history[slot].fill(PAD)
        self.table[slot].fill(-1)
        self.length[slot] = 0
        self.generated[slot] = 0
        self.overflow[slot] = 0
        self.width[slot] = width
        self.scope[slot] = SCOPES.index(scope)
        self.max_history[slot] = -1 if max_history is None else max_history
        if scope == "all" and len(prompt):
            self.append(np.array([slot]), np.asarray(list(prompt), dtype=np.int64)[None, :], generated=False)

    def append(self, slots: np.ndarray, tokens: np.ndarray, counts: np.ndarray | None = None, *,
               generated: bool = True) -> None:
        """Commit tokens [B, N] (the first counts[b] of row b) to the requests in slots [B]."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim == 1:
            tokens = tokens[:, None]
        if counts is None:
            counts = np.full(len(slots), tokens.shape[1], dtype=np.int64)
        _append(self.history, self.table, self.length, self.generated, self.width, self.scope, self.overflow,
                slots, np.ascontiguousarray(tokens), np.ascontiguousarray(counts, dtype=np.int64), generated)

    def next_repeated(self, slots: np.ndarray) -> np.ndarray:
        """bool [B]: whether each row's next token must be drawn without the watermark."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        out = np.empty(len(slots), dtype=np.bool_)
        _next_repeated(self.history, self.table, self.length, self.generated, self.width, self.scope,
                       self.max_history, slots, out)
        return out

    def contexts(self, slots: np.ndarray, columns: int = MAX_WIDTH) -> np.ndarray:
        """int64 [B, columns]: each row's watermark context in its first width entries."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        out = np.zeros((len(slots), columns), dtype=np.int64)
        _contexts(self.history, self.length, self.generated, self.width, slots, out)
        return out
