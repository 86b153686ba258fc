"""The detector's deduplication compiled (numba): :func:`watermark.dedup.first_occurrence_mask`
as one pass with an open-addressing hash set of contexts (each probe compared entry by
entry, so a collision costs a probe, never a wrong answer), instead of numpy's sort.
"""

from __future__ import annotations

import functools

import numpy as np

from watermark import jit
from watermark.dedup import PAD, first_occurrence_mask as first_occurrence_mask_numpy

_H1 = np.uint64(0x9E3779B97F4A7C15)
_H2 = np.uint64(0xBF58476D1CE4E5B9)


def _first_occurrence(padded, width, skip_padded, table, keep):  # pragma: no cover - compiled
    """keep[p] for p < len(keep): the context padded[p : p + width] occurs at no earlier p
    (and, with ``skip_padded``, holds no PAD). table: int64 [power of 2 >= 2n], scratch."""
    n = keep.shape[0]
    mask = table.shape[0] - 1
    for i in range(table.shape[0]):
        table[i] = -1
    for p in range(n):
        h = np.uint64(0)
        for i in range(width):
            x = (np.uint64(padded[p + i]) + np.uint64(i + 1) * _H1) * _H2
            h += x ^ (x >> np.uint64(31))
        h ^= h >> np.uint64(29)
        slot = np.int64(h & np.uint64(mask))
        first = True
        while True:
            other = table[slot]
            if other < 0:
                table[slot] = p
                break
            same = True
            for i in range(width):
                if padded[other + i] != padded[p + i]:
                    same = False
                    break
            if same:
                first = False
                break
            slot = (slot + 1) & mask
        if first and skip_padded:
            for i in range(width):
                if padded[p + i] == PAD:
                    first = False
                    break
        keep[p] = first


def _scored(padded, width, skip_padded, table, keep, positions, contexts, tokens):  # pragma: no cover - compiled
    """The first occurrences (``_first_occurrence``) as positions [m], contexts [m, w] and
    tokens [m], written into the first m rows of the outputs; returns m."""
    _first_occurrence(padded, width, skip_padded, table, keep)
    m = 0
    for p in range(keep.shape[0]):
        if keep[p]:
            positions[m] = p
            for i in range(width):
                contexts[m, i] = padded[p + i]
            tokens[m] = padded[p + width]
            m += 1
    return m


@functools.cache
def compiled():
    return jit.compile_all({"_first_occurrence": _first_occurrence, "_scored": _scored})


def first_occurrence_mask(token_ids: np.ndarray, width: int, skip_padded: bool = False) -> np.ndarray:
    """:func:`watermark.dedup.first_occurrence_mask`, compiled (numpy's where numba is missing)."""
    fns = compiled()
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if fns is None:  # pragma: no cover - exercised where numba is missing
        return first_occurrence_mask_numpy(tokens, width, skip_padded)
    padded = np.concatenate([np.full(width, PAD, dtype=np.int64), tokens])
    table = np.empty(1 << max(4, (2 * len(tokens)).bit_length()), dtype=np.int64)
    keep = np.empty(len(tokens), dtype=np.bool_)
    fns["_first_occurrence"](padded, width, skip_padded, table, keep)
    return keep


def scored(token_ids: np.ndarray, width: int, skip_padded: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions [m], contexts [m, w], tokens [m]) of the first occurrences: what
    ``detector.scoring.scored_positions`` builds from :func:`first_occurrence_mask`, in one
    compiled pass."""
    fns = compiled()
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if fns is None:  # pragma: no cover - exercised where numba is missing
        from watermark.dedup import context_matrix

        positions = np.flatnonzero(first_occurrence_mask_numpy(tokens, width, skip_padded))
        return positions, np.ascontiguousarray(context_matrix(tokens, width)[positions]), tokens[positions]
    n = len(tokens)
    padded = np.empty(n + width, dtype=np.int64)
    padded[:width] = PAD
    padded[width:] = tokens
    table = np.empty(1 << max(4, (2 * n).bit_length()), dtype=np.int64)
    keep = np.empty(n, dtype=np.bool_)
    positions = np.empty(n, dtype=np.int64)
    contexts = np.empty((n, width), dtype=np.int64)
    kept = np.empty(n, dtype=np.int64)
    m = fns["_scored"](padded, width, skip_padded, table, keep, positions, contexts, kept)
    return positions[:m], contexts[:m], kept[:m]
