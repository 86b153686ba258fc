"""Server-sent events, as every streaming route sends them."""

from __future__ import annotations

import json
from typing import Any


def sse(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"
