"""`hallmark detect --jsonl`'s token-id lists read in one compiled pass (numba): the list's
bytes checked against JSON's grammar for a list of non-negative integers and converted in
the same loop, where service.cli.token_lines's numpy reading makes about ten passes (the
byte classes, the leading-zero test, numpy's text reader, the counts). Used once numba is
loaded (after a batch's first line, watermark.jit); the same answers as the numpy reading,
tested against ``json.loads`` on the same lines.
"""

from __future__ import annotations

import functools

import numpy as np

from watermark import jit

INVALID = -1
"""Not a JSON list body of non-negative integers (the caller leaves the line to json.loads)."""
OUT_OF_RANGE = -2
"""A JSON list of non-negative integers, one of them above 2^32 - 1."""


def _read_ids(raw, out):  # pragma: no cover - compiled
    """The integers of ``raw``, the bytes between a JSON list's brackets, into ``out`` (at
    least len(raw) // 2 + 1 long); returns how many, or INVALID / OUT_OF_RANGE. JSON's white
    space is space, tab, LF and CR; a number is 0 or starts with 1-9."""
    size = raw.shape[0]
    i = 0
    while i < size and (raw[i] == 32 or raw[i] == 9 or raw[i] == 10 or raw[i] == 13):
        i += 1
    if i == size:
        return 0
    n = 0
    big = False
    while True:
        c = raw[i]
        if c < 48 or c > 57:
            return -1
        if c == 48 and i + 1 < size and raw[i + 1] >= 48 and raw[i + 1] <= 57:
            return -1  # a leading zero
        value = 0
        first = i
        while i < size:
            d = np.int64(raw[i]) - 48
            if d < 0 or d > 9:
                break
            value = value * 10 + d  # wraps past 19 digits: then the count below says too big
            i += 1
        if i - first > 10 or value > 4294967295:
            big = True
        else:
            out[n] = value
        n += 1
        while i < size and (raw[i] == 32 or raw[i] == 9 or raw[i] == 10 or raw[i] == 13):
            i += 1
        if i == size:
            return -2 if big else n
        if raw[i] != 44:
            return -1
        i += 1
        while i < size and (raw[i] == 32 or raw[i] == 9 or raw[i] == 10 or raw[i] == 13):
            i += 1
        if i == size:
            return -1  # a trailing comma


@functools.cache
def compiled():
    return jit.compile_all({"_read_ids": _read_ids})


def read_ids(body: bytes) -> np.ndarray | int | None:
    """The integers of a JSON list's body (int64), OUT_OF_RANGE, INVALID; None where numba
    is missing."""
    fns = compiled()
    if fns is None:  # pragma: no cover - exercised where numba is missing
        return None
    raw = np.frombuffer(body, dtype=np.uint8)
    out = np.empty(len(raw) // 2 + 1, dtype=np.int64)
    n = fns["_read_ids"](raw, out)
    return out[:n] if n >= 0 else int(n)
