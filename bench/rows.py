"""A bench's result rows: each printed as one JSON line and appended to ``--out`` (JSONL), so
that alternating runs of several trees accumulate in one file."""

from __future__ import annotations

import json


def emit(row: dict, out: str | None) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
