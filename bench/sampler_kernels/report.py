"""A bench result printed and, with ``--out``, written as JSON: the end of every stand-alone
script in this package."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, out: Path | None) -> int:
    """Print ``result``; write it to ``out`` when given. Returns the exit status (0)."""
    print(json.dumps(result, indent=1))
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0
