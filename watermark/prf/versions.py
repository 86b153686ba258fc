"""The PRF versions a spec may name, vLLM's short names for them, and each one's key size (a
leaf module: the package's lookup and each implementation both read it)."""

from __future__ import annotations

PHILOX_V1 = "philox4x32-10-v1"
HMAC_PHILOX_V1 = "hmac-sha256-philox-v1"
HMAC_SHA256_V1 = "hmac-sha256-v1"

NAMES: dict[str, str] = {
    "philox": PHILOX_V1, PHILOX_V1: PHILOX_V1,
    HMAC_PHILOX_V1: HMAC_PHILOX_V1,
    "hmac_sha256": HMAC_SHA256_V1, HMAC_SHA256_V1: HMAC_SHA256_V1,
}
"""Every accepted ``prf`` name (versions and vLLM's short names) -> its version."""

KEY_BITS: dict[str, int] = {PHILOX_V1: 64, HMAC_PHILOX_V1: 256, HMAC_SHA256_V1: 256}
"""Each version's secret size in bits: what brute force over the key space costs."""

VLLM_NAMES: dict[str, str] = {PHILOX_V1: "philox", HMAC_SHA256_V1: "hmac_sha256"}
"""The versions vLLM knows, by the name its ``WatermarkConfig.prf`` takes."""
