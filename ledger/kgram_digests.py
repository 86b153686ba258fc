"""The k-grams a generation records: keyed 63-bit hashes of its token 8-grams, under either
scheme (ledger.kgrams says what each scheme keys them with, and how a text is matched to them).
Pure hashing: no database, no key store; the store's k-gram key comes from the caller."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

K = 8
"""Tokens per k-gram."""
DIGEST_BITS = 63
V1, V2 = 1, 2
"""The schemes (module docstring): per watermark key; the store's one k-gram key."""


def kgram_key(secret: int) -> bytes:
    """Scheme 1's k-gram HMAC key of a watermark key secret: over its 8 bytes (a 64-bit key, as
    always) or 32 (a 256-bit key), as watermark.prf.secret_bytes encodes secrets."""
    secret = int(secret)
    return hashlib.sha256(b"hallmark-kgram-v1" + secret.to_bytes(8 if secret < 2**64 else 32, "big")).digest()


def position_digests(token_ids: Sequence[int], secret: int, k: int = K,
                     memo: dict[bytes, int] | None = None) -> list[int]:
    """The scheme 1 digest (63 bits) of the k-gram starting at each position of ``token_ids``
    [n] under the watermark key ``secret`` (n - k + 1 of them; empty if n < k). ``memo``:
    digests of k-grams already hashed under ``secret`` (by their 4k bytes), read and extended:
    the forms of one text (as sent, normalised) share most of their k-grams, so each distinct
    one is hashed once."""
    return keyed_position_digests(token_ids, kgram_key(secret), k, memo)


DigestArray = Callable[[Sequence[int], bytes, int], "np.ndarray | None"]
"""A compiled digest pass over a whole text (token ids, HMAC key, k) -> int64 [n - k + 1], or
None where it cannot answer. The ledger only builds on the watermark's spec and key types, so
the service passes one in (service.kgram_hashing: watermark.prf.hmac_compiled's SHA-256)."""


def keyed_position_digests(token_ids: Sequence[int], key: bytes, k: int = K,
                           memo: dict[bytes, int] | None = None,
                           digest_array: DigestArray | None = None) -> list[int]:
    """:func:`position_digests` under the HMAC key ``key`` itself (scheme 2: the store's).
    ``memo``: read and extended by the pure-Python path only; ``digest_array``: a compiled pass
    tried first (one pass over a whole text is cheaper than looking its k-grams up)."""
    found = digest_array(token_ids, key, k) if digest_array is not None else None
    if found is not None:
        return found.tolist()
    return _keyed_position_digests_python(token_ids, key, k, memo)


def _keyed_position_digests_python(token_ids: Sequence[int], key: bytes, k: int = K,
                                   memo: dict[bytes, int] | None = None) -> list[int]:
    # HMAC (RFC 2104) from two SHA-256 states, the key's inner and outer padded blocks hashed
    # once and copied per k-gram: the same digests as hmac.new(key, gram).
    inner = outer = None
    data = struct.pack(f">{len(token_ids)}I", *[int(t) & 0xFFFFFFFF for t in token_ids])
    memo = {} if memo is None else memo
    out = []
    for start in range(0, len(token_ids) - k + 1):
        gram = data[4 * start:4 * (start + k)]
        digest = memo.get(gram)
        if digest is None:
            if inner is None:
                inner, outer = hmac_states(key)
            mac = inner.copy()
            mac.update(gram)
            final = outer.copy()
            final.update(mac.digest())
            digest = memo[gram] = int.from_bytes(final.digest()[:8], "big") >> (64 - DIGEST_BITS)
        out.append(digest)
    return out


def hmac_states(key: bytes) -> tuple["hashlib._Hash", "hashlib._Hash"]:
    """SHA-256 states after HMAC's inner and outer padded key blocks (a key of at most one
    64-byte block, as both schemes' 32 bytes)."""
    block = key.ljust(64, b"\0")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in block)), hashlib.sha256(bytes(b ^ 0x5C for b in block)))


def digests(token_ids: Sequence[int], secret: int, k: int = K) -> set[int]:
    """Distinct scheme 1 digests of the k-grams of ``token_ids`` [n] under ``secret`` (empty if n < k)."""
    return set(position_digests(token_ids, secret, k))


@dataclass(frozen=True)
class KgramSet:
    """What a finished generation's ledger entry records and commits to (ledger.entries's
    ``kgram_set``): its key id and its output token ids, hashed when recorded under the
    store's k-gram key (scheme 2) or, for a store with none, the key's own (scheme 1).
    ``secret`` never in ``repr``."""

    key_id: str
    secret: int = field(repr=False)
    token_ids: tuple[int, ...] = field(repr=False)
    scheme: int | None = None
    """Force a scheme (None: 2 where the store has a k-gram key). 1: what a store recorded
    before migration 0010 (tests and benchmarks of old data)."""

    def digests(self, store_key: bytes | None) -> tuple[int, set[int]]:
        """(scheme, distinct digests) as recorded under ``store_key`` (the store's k-gram key)."""
        if self.scheme == V1 or (self.scheme is None and store_key is None):
            return V1, digests(self.token_ids, self.secret)
        if store_key is None:
            raise ValueError("scheme 2 k-grams need the store's k-gram key (its transparency-log key)")
        return V2, set(keyed_position_digests(self.token_ids, store_key))


def kgram_set(key_id: str, secret: int, token_ids: Sequence[int], scheme: int | None = None) -> KgramSet:
    """A finished generation's :class:`KgramSet`."""
    return KgramSet(key_id, int(secret), tuple(int(t) for t in token_ids), scheme)
