"""The PRF versions a spec may name, and vLLM's short names for them (a leaf module: the
package's lookup and each implementation both read it)."""

from __future__ import annotations

PHILOX_V1 = "philox4x32-10-v1"

NAMES: dict[str, str] = {"philox": PHILOX_V1, PHILOX_V1: PHILOX_V1}
"""Every accepted ``prf`` name (versions and vLLM's short names) -> its version."""
