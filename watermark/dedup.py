"""Context deduplication: a repeated context is sampled without the watermark.

Reusing a context reuses its random vector, which biases a single text towards loops and
makes the detector's per-token scores dependent (SynthID-Text, supplementary G.3). The
rule, identical to vLLM 0.32's scan:

* The *history* is the request's generated tokens (scope ``single_turn``) or its prompt
  followed by them (``all``). History position p has context ctx(p): the w entries
  before it in ``[-1] * w + history``.
* The token at the next position L = len(history) is sampled without the watermark if
  its watermark context (its last w generated tokens, -1 padded) equals ctx(p) for some
  p in [L - H, L) (H = max history, or all of them).
* Scope ``all`` also skips every context that still holds padding (the first w tokens).

:class:`ContextDeduper` keeps, per request, the last position of every context seen
inside the window: one dict lookup and one insert per token instead of a scan.
:func:`repeated_by_scan` is the literal scan, kept for tests.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

if TYPE_CHECKING:  # the spec module needs pydantic, which GPU-only images may lack
    from watermark.spec import DedupScope

PAD = -1


class ContextDeduper:
    """Per-request context history with O(1) lookups; ``max_history`` None means unbounded.

    It also tracks the request's watermark context (its last w generated tokens).
    """

    def __init__(self, width: int, scope: "DedupScope", max_history: int | None,
                 prompt: Sequence[int] = ()) -> None:
        if width < 1:
            raise ValueError("context width must be >= 1")
        if max_history is not None and max_history < 1:
            raise ValueError("max_history must be >= 1 or None")
        self.width = width
        self.scope = scope
        self.max_history = max_history
        self._last_seen: dict[tuple[int, ...], int] = {}
        self._order: deque[tuple[int, tuple[int, ...]]] = deque()
        self._window: deque[int] = deque([PAD] * width, maxlen=width)  # history window
        self._generated_window: deque[int] = deque([PAD] * width, maxlen=width)
        self._length = 0
        self._generated = 0
        if scope == "all":
            for token in prompt:
                self._append(int(token))

    @property
    def length(self) -> int:
        """Positions in the history so far (the next token's position)."""
        return self._length

    @property
    def generated(self) -> int:
        return self._generated

    @property
    def context(self) -> tuple[int, ...]:
        """The next token's watermark context: the last w generated tokens, -1 padded."""
        return tuple(self._generated_window)

    def _append(self, token: int) -> None:
        ctx = tuple(self._window)
        self._last_seen[ctx] = self._length
        if self.max_history is not None:
            self._order.append((self._length, ctx))
        self._window.append(token)
        self._length += 1
        if self.max_history is not None:
            horizon = self._length - self.max_history
            while self._order and self._order[0][0] < horizon:
                pos, old = self._order.popleft()
                if self._last_seen.get(old) == pos:
                    del self._last_seen[old]

    def _seen(self, context: tuple[int, ...], position: int) -> bool:
        last = self._last_seen.get(context)
        return last is not None and (self.max_history is None or last >= position - self.max_history)

    def next_repeated(self) -> bool:
        """Whether the next token must be sampled without the watermark."""
        if self.scope == "none":
            return False
        if self.scope == "all" and self._generated < self.width:
            return True
        # Here the watermark context equals the history window's.
        return self._seen(self.context, self._length)

    def block_repeated(self, drafts: Sequence[int]) -> list[bool]:
        """Decisions for positions L .. L + len(drafts) of a speculative block, where
        position L + j follows drafts[:j] (drafts not yet committed)."""
        count = len(drafts) + 1
        if self.scope == "none":
            return [False] * count
        window = deque(self._window, maxlen=self.width)
        pending: list[tuple[int, tuple[int, ...]]] = []
        decisions = []
        for j in range(count):
            position = self._length + j
            ctx = tuple(window)
            if self.scope == "all" and self._generated + j < self.width:
                repeated = True
            else:
                repeated = self._seen(ctx, position) or any(
                    c == ctx and (self.max_history is None or p >= position - self.max_history)
                    for p, c in pending
                )
            decisions.append(repeated)
            pending.append((position, ctx))
            if j < len(drafts):
                window.append(int(drafts[j]))
        return decisions

    def push(self, token: int) -> None:
        """Commit the token sampled at the next position."""
        token = int(token)
        self._append(token)
        self._generated_window.append(token)
        self._generated += 1

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.push(token)


def repeated_by_scan(history: Sequence[int], context: Sequence[int], width: int,
                     max_history: int | None) -> bool:
    """Literal scan (reference): does ``context`` equal ctx(p) for p in the window?"""
    padded = [PAD] * width + list(history)
    length = len(history)
    start = 0 if max_history is None else max(0, length - max_history)
    target = list(context)
    return any(padded[p:p + width] == target for p in range(start, length))


def first_occurrence_mask(token_ids: np.ndarray, width: int, skip_padded: bool = False) -> np.ndarray:
    """Detector side: True at positions whose context (w previous tokens, -1 padded) has not
    occurred at an earlier position of the text, and (``skip_padded``) holds no padding.

    token_ids [n] give a bool mask [n]. Exact: hashing only groups candidates, which are
    then compared entry by entry.
    """
    n = len(token_ids)
    contexts = context_matrix(token_ids, width)
    if n == 0:
        return np.zeros(0, dtype=bool)
    mixed = _hash_rows(contexts)
    _, first_index, inverse = np.unique(mixed, return_index=True, return_inverse=True)
    owner = first_index[inverse]
    keep = owner == np.arange(n)
    # A hash collision between different contexts would merge them: check and repair.
    duplicates = np.flatnonzero(~keep)
    if duplicates.size and not np.array_equal(contexts[duplicates], contexts[owner[duplicates]]):
        keep = _first_occurrence_exact(contexts)
    if skip_padded:
        keep &= ~(contexts == PAD).any(axis=1)
    return keep


def context_matrix(token_ids: np.ndarray, width: int) -> np.ndarray:
    """token_ids [n] give contexts [n, w] (int64), -1 before the first token."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    padded = np.concatenate([np.full(width, PAD, dtype=np.int64), tokens])
    return np.lib.stride_tricks.sliding_window_view(padded, width)[: len(tokens)]


def _hash_rows(rows: np.ndarray) -> np.ndarray:
    u = rows.astype(np.uint64)
    h = np.full(len(rows), 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in range(rows.shape[1]):
            h = (h ^ u[:, column]) * np.uint64(0x100000001B3)
            h ^= h >> np.uint64(29)
    return h


def _first_occurrence_exact(contexts: np.ndarray) -> np.ndarray:
    seen: set[tuple[int, ...]] = set()
    keep = np.zeros(len(contexts), dtype=bool)
    for i, row in enumerate(map(tuple, contexts.tolist())):
        if row not in seen:
            seen.add(row)
            keep[i] = True
    return keep
