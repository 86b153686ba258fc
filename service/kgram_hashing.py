"""The gateway's k-gram cache with the compiled digest pass: the ledger builds on the
watermark's spec and key types only (tests/test_imports.py), so the compiled HMAC-SHA-256 of
watermark.prf.hmac_compiled reaches it from here, as ledger.kgram_digests.DigestArray."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ledger.kgram_digests import DIGEST_BITS
from ledger.kgrams import KgramCache
from watermark.prf import hmac_compiled


def digest_array(token_ids: Sequence[int], key: bytes, k: int) -> np.ndarray | None:
    """The ledger's k-gram digests of a whole text in one compiled pass (None: the ledger's
    Python path answers)."""
    return hmac_compiled.kgram_digest_array(token_ids, key, k, DIGEST_BITS)


def kgram_cache() -> KgramCache:
    """A request's k-gram cache, hashing through :func:`digest_array`."""
    return KgramCache(digest_array=digest_array)
