"""Every admitted request's generated tokens and counters as arrays, one row per request.

The step loop takes a block's tokens for all its rows at once (:meth:`OutputTable.take`):
a few numpy operations over the block, whatever the number of rows, where a Python loop
per row took 2 ms per block at 256 rows on the H100 (issue 33). A request's
:class:`~service.engines.local.request.RequestState` reads its output, last token and
counters from its row; the speculative group's pending draft inputs live here too, so a
block's inputs are packed from arrays (:meth:`OutputTable.pack`).

A request keeps its row from admission until it has finished and left the batch; it then
copies its output out (:meth:`OutputTable.close`) and the row is reused.
"""

from __future__ import annotations

import numpy as np

from watermark.dedup import PAD

RUNNING, STOPPED, LENGTH = 0, 1, 2
"""Why a row ended in a take: not at all, at an EOS token, at its max_tokens."""
ROUTES = 4
"""ROUTE_GREEDY, ROUTE_PLAIN, ROUTE_KEY_A, ROUTE_KEY_B (watermark.results): column index."""


class OutputTable:
    """Rows of requests: ``tokens`` [rows, capacity] int32 with ``length`` [rows] of them
    generated, ``routes`` [rows, 4] (tokens per route), ``drafted``/``accepted`` [rows]
    (speculation), ``max_tokens`` [rows], ``eos`` [rows, E] (each row's EOS ids, -1 padded)
    and the draft model's ``pending`` inputs [rows, 2] (``pending_count`` [rows] of them,
    left-aligned); ``done`` [rows] mirrors each request's ``finished`` and ``one_by_one``
    [rows] marks requests with stop strings (taken by RequestState.emit_block)."""

    def __init__(self, rows: int, capacity: int) -> None:
        self.capacity = capacity
        self.tokens = np.zeros((rows, capacity), dtype=np.int32)
        self.length = np.zeros(rows, dtype=np.int64)
        self.routes = np.zeros((rows, ROUTES), dtype=np.int64)
        self.drafted = np.zeros(rows, dtype=np.int64)
        self.accepted = np.zeros(rows, dtype=np.int64)
        self.max_tokens = np.zeros(rows, dtype=np.int64)
        self.eos = np.full((rows, 1), -1, dtype=np.int64)
        self.pending = np.zeros((rows, 2), dtype=np.int64)
        self.pending_count = np.zeros(rows, dtype=np.int64)
        self.done = np.zeros(rows, dtype=bool)
        self.one_by_one = np.zeros(rows, dtype=bool)
        self._free = list(range(rows - 1, -1, -1))  # popped from the end: lowest row first

    def open(self, max_tokens: int, eos_ids, one_by_one: bool = False) -> int:
        """A fresh row for a request (RuntimeError when all are in use)."""
        if max_tokens > self.capacity:
            raise ValueError(f"max_tokens {max_tokens} exceeds the output table's capacity {self.capacity}")
        if not self._free:
            raise RuntimeError("every output row is in use")
        row = self._free.pop()
        eos = sorted(int(e) for e in eos_ids)
        if len(eos) > self.eos.shape[1]:
            self.eos = np.pad(self.eos, ((0, 0), (0, len(eos) - self.eos.shape[1])), constant_values=-1)
        self.eos[row] = -1
        self.eos[row, :len(eos)] = eos
        self.length[row] = self.drafted[row] = self.accepted[row] = self.pending_count[row] = 0
        self.routes[row] = 0
        self.max_tokens[row] = max_tokens
        self.done[row] = False
        self.one_by_one[row] = one_by_one
        return row

    def close(self, row: int) -> None:
        self._free.append(row)

    # ------------------------------------------------------------------ one row (Python scalars)

    def output(self, row: int) -> list[int]:
        return self.tokens[row, :self.length[row]].tolist()

    def append(self, row: int, token: int, route: int) -> None:
        n = int(self.length[row])
        self.tokens[row, n] = token
        self.length[row] = n + 1
        self.routes[row, route] += 1

    # ------------------------------------------------------------------ many rows (arrays)

    def take(self, rows: np.ndarray, tokens: np.ndarray, routes: np.ndarray, emitted: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
        """Take each row's first ``emitted[b]`` of ``tokens`` [B, m] (``routes`` [B, m] theirs)
        as one request would one by one: an EOS token ends the row before it (not taken), and
        the row ends once it holds ``max_tokens``. Returns (taken [B], why [B]: RUNNING,
        STOPPED or LENGTH)."""
        m = tokens.shape[1]
        j = np.arange(m)
        live = j < emitted[:, None]
        eos = (tokens[:, :, None] == self.eos[rows][:, None, :]).any(axis=2) & live
        first_eos = np.where(eos.any(axis=1), eos.argmax(axis=1), m)
        room = self.max_tokens[rows] - self.length[rows]
        cap = np.minimum(first_eos, emitted)
        taken = np.minimum(cap, room)
        why = np.where(room <= cap, LENGTH, np.where(first_eos < emitted, STOPPED, RUNNING))
        mask = j < taken[:, None]
        where_rows = np.broadcast_to(rows[:, None], mask.shape)[mask]
        where_cols = (self.length[rows][:, None] + j)[mask]
        self.tokens[where_rows, where_cols] = tokens[mask]
        for route in range(ROUTES):
            self.routes[rows, route] += ((routes == route) & mask).sum(axis=1)
        self.length[rows] += taken
        return taken, why

    def last_tokens(self, rows: np.ndarray) -> np.ndarray:
        """[B] each row's last token (0 for a row without one)."""
        n = self.length[rows]
        return np.where(n > 0, self.tokens[rows, np.maximum(n - 1, 0)], 0)

    def contexts(self, rows: np.ndarray, widths: np.ndarray, columns: int) -> np.ndarray:
        """[B, columns] each row's watermark context (its last ``widths[b]`` tokens, -1 before
        the first) right-aligned, zeros to its left: ``rows.right_aligned`` of a row's
        ``ContextDeduper.context``."""
        n = self.length[rows]
        col = np.arange(columns)
        at = n[:, None] - columns + col  # the output position column c shows
        inside = col >= columns - widths[:, None]
        values = np.where(at >= 0, self.tokens[rows[:, None], np.maximum(at, 0)], PAD)
        return np.where(inside, values, 0)

    def set_pending(self, rows: np.ndarray, first: np.ndarray, second: np.ndarray, count: np.ndarray) -> None:
        self.pending[rows, 0] = first
        self.pending[rows, 1] = second
        self.pending_count[rows] = count
