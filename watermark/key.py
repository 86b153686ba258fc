"""A watermark key: a 64-bit secret with its spec, and the sub-keys derived from it.

The secret never appears in ``repr``/``str``; :func:`fingerprint` names a key without
revealing it (a truncated HMAC-SHA256 of a fixed label under the secret).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from watermark import prf
from watermark.spec import WatermarkSpec

FINGERPRINT_LABEL = b"hallmark/key-fingerprint/v1"
KEY_A_DOMAIN = "key_a"
KEY_B_DOMAIN = "key_b"
# Hallmark's extension: the keyed speculative acceptance coin (vLLM has no such key).
KEY_COIN_DOMAIN = "hallmark_coin"


def fingerprint(secret: int) -> str:
    """16 hex digits of HMAC-SHA256(secret, label): stable, public, reveals nothing useful."""
    prf.check_key(secret)
    mac = hmac.new(secret.to_bytes(8, "big"), FINGERPRINT_LABEL, hashlib.sha256)
    return mac.hexdigest()[:16]


@dataclass(frozen=True)
class WatermarkKey:
    """The secret and spec one generation or detection runs under."""

    secret: int = field(repr=False)
    spec: WatermarkSpec = field(default_factory=WatermarkSpec)

    def __post_init__(self) -> None:
        prf.check_key(self.secret)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.secret)

    @property
    def key_a(self) -> int:
        return prf.derive_key(self.secret, KEY_A_DOMAIN)

    @property
    def key_b(self) -> int:
        return prf.derive_key(self.secret, KEY_B_DOMAIN)

    @property
    def key_coin(self) -> int:
        return prf.derive_key(self.secret, KEY_COIN_DOMAIN)

    def scoring_keys(self) -> tuple[int, ...]:
        """The PRF keys a token of this key's text may carry: (key,) or (key_a, key_b)."""
        if self.spec.algorithm == "gumbel":
            return (self.secret,)
        return (self.key_a, self.key_b)
