"""Plain-text rendering of command results (``--json`` prints the data instead)."""

from __future__ import annotations

import json
from typing import Any


def table(rows: list[list[Any]], headers: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [headers] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)
