"""JSON lines holding long token-id lists, parsed fast (``hallmark detect --jsonl``).

``json.loads`` builds a Python int per token (about 0.05 us each) and checking them is as
much again: at 2,000 tokens a line that was half of a batch's time. Here the list's text
is located, checked to hold only what a JSON list of non-negative integers can hold
(digits, commas, white space; no leading zero), and read by numpy's text reader in C, with
any leftover text an error; the rest of the line goes through ``json.loads``. Whatever the
fast path cannot vouch for (a second ``"token_ids"``, a list it does not read to its end,
a line whose remainder is not the object it expects) goes through ``json.loads`` whole, so
the result, and every error, is what ``json.loads`` would give. Once numba is loaded (after
a batch's first line), the list is checked and read in one compiled pass instead
(service.cli.token_lines_compiled), with the same answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from watermark import jit

KEY = '"token_ids"'
MAX_TOKEN_ID = 2**32 - 1
_LIST = re.compile(r'"token_ids"\s*:\s*\[')


def _fast(line: str) -> dict[str, Any] | None:
    found = _LIST.search(line)
    if found is None:
        return None
    start = found.end()
    stop = line.find("]", start)
    if stop < 0:
        return None
    body = line[start:stop]
    try:
        encoded = body.encode("ascii")
    except UnicodeEncodeError:
        return None
    if jit.loaded():
        return _fast_compiled(line, start, stop, encoded)
    raw = np.frombuffer(encoded, dtype=np.uint8)
    digit = (raw - 48) < 10  # uint8: bytes below '0' wrap above 9
    comma = raw == 44
    if not (digit | comma | (raw == 32)).all():  # json.dumps's ", "; tabs and newlines: rare
        if not (digit | comma | (raw == 32) | (raw == 9) | (raw == 10) | (raw == 13)).all():
            return None
    # The body holds no '"', so the key's occurrences in the line are those around it.
    if line.count(KEY, 0, start) != 1 or KEY in line[stop:]:
        return None
    first = digit.copy()  # a number's first digit
    first[1:] &= ~digit[:-1]
    if (first[:-1] & (raw[:-1] == 48) & digit[1:]).any():  # a leading zero (JSON has none)
        return None
    if body.strip():
        try:  # text numpy cannot read to its end: ValueError (numpy 2; older numpy warned and stopped)
            tokens = np.fromstring(body, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
        # Read to its end: every number read (one per run of digits), and the commas exactly
        # those between them (a trailing comma reads without complaint).
        runs = np.count_nonzero(first)
        if len(tokens) != runs or np.count_nonzero(comma) != runs - 1:
            return None
    else:
        tokens = np.zeros(0, dtype=np.int64)
    rest = _rest(line, start, stop)
    if rest is None:
        return None
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) > MAX_TOKEN_ID):
        raise ValueError("token ids must be in [0, 2**32)")
    rest["token_ids"] = tokens
    return rest


def _rest(line: str, start: int, stop: int) -> dict[str, Any] | None:
    """The line without its list's body, when that is the object the fast path expects."""
    try:
        rest = json.loads(line[:start] + line[stop:])
    except json.JSONDecodeError:
        return None
    if not isinstance(rest, dict) or rest.get("token_ids") != []:
        return None
    return rest


def _fast_compiled(line: str, start: int, stop: int, body: bytes) -> dict[str, Any] | None:
    """:func:`_fast` with the list read in one compiled pass (numba loaded)."""
    from service.cli.token_lines_compiled import INVALID, OUT_OF_RANGE, read_ids

    tokens = read_ids(body)
    if tokens is None or (isinstance(tokens, int) and tokens == INVALID):
        return None
    # A valid body holds no '"', so the key's occurrences in the line are those around it.
    if line.count(KEY, 0, start) != 1 or KEY in line[stop:]:
        return None
    rest = _rest(line, start, stop)
    if rest is None:
        return None
    if isinstance(tokens, int) and tokens == OUT_OF_RANGE:
        raise ValueError("token ids must be in [0, 2**32)")
    rest["token_ids"] = tokens
    return rest


def parse_line(line: str) -> Any:
    """``json.loads(line)``, except that a top-level ``"token_ids"`` list of integers comes
    back as a checked int64 array (ValueError for ids outside [0, 2^32))."""
    fast = _fast(line)
    return fast if fast is not None else json.loads(line)
