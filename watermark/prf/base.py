"""What every watermark PRF is: keys of 64 or 256 bits, sub-key derivation, and the interface.

A PRF maps (key, context, token) to a 32-bit word and the word to a float32 uniform in
(0, 1). The key conventions here (an unsigned key of the version's size; sub-keys by
SHA-256) belong to the watermark scheme, not to one PRF, so every PRF version shares them.
A 64-bit key's sub-keys are what vLLM derives (the first 8 bytes of the digest); a 256-bit
key's sub-keys are the whole digest over its 32 bytes, so no derivation narrows a 256-bit
key's secret to 64 bits (a salt, key A, key B or the coin of a 256-bit key is 256 bits).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the interface names numpy types; only implementations load numpy
    import numpy as np

MAX_KEY = 2**64 - 1
MAX_KEY_256 = 2**256 - 1
KEY_SIZES = (64, 256)


def check_key(key: int, bits: int = 64) -> int:
    """Return ``key`` if it is a valid PRF key of ``bits`` bits (64 or 256), else raise ValueError."""
    if bits not in KEY_SIZES:
        raise ValueError(f"a watermark key has 64 or 256 bits, not {bits}")
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < 1 << bits:
        raise ValueError(f"a watermark key must be an integer in [0, 2**{bits} - 1]")
    return key


def secret_bytes(key: int) -> bytes:
    """The bytes a secret is sealed and fingerprinted as: 8 (big-endian) when it fits 64 bits,
    else 32. A function of the integer alone, so every 64-bit key keeps its stored bytes and
    fingerprint; a 256-bit key below 2**64 (probability 2**-192) is still the same integer."""
    check_key(key, 256)
    return key.to_bytes(8 if key <= MAX_KEY else 32, "big")


def derive_key(key: int, domain: str | bytes, bits: int = 64) -> int:
    """Sub-key. 64 bits: the first 8 bytes (big-endian) of SHA-256(domain || key as 8 bytes
    big-endian), vLLM's derivation. 256 bits: the whole digest of SHA-256(domain || key as 32
    bytes big-endian)."""
    check_key(key, bits)
    tag = domain.encode() if isinstance(domain, str) else domain
    digest = hashlib.sha256(tag + key.to_bytes(bits // 8, "big")).digest()
    return int.from_bytes(digest[:bits // 8], "big")


def derive_keys(key: int, tags: tuple[bytes, ...], sub_tags: tuple[bytes, ...] = (),
                bits: int = 64) -> list[tuple[int, ...]]:
    """For each tag: ``(k, *(derive_key(k, sub) for sub in sub_tags))`` with ``k =
    derive_key(key, tag)``, the key checked once. Opening a store derives 3 x 16 sub-keys for
    each `diverse` key (its salted secrets, then their key A and key B); one
    :func:`derive_key` call at a time, the calls cost several times the SHA-256s."""
    check_key(key, bits)
    sha256, from_bytes, size = hashlib.sha256, int.from_bytes, bits // 8
    raw = key.to_bytes(size, "big")
    firsts = [sha256(tag + raw).digest()[:size] for tag in tags]  # each derived key's bytes, big-endian
    columns = [[from_bytes(first, "big") for first in firsts]]
    for sub in sub_tags:
        columns.append([from_bytes(sha256(sub + first).digest()[:size], "big") for first in firsts])
    return list(zip(*columns))


def to_signed64(key: int) -> int:
    """The int64 whose bit pattern is the unsigned 64-bit ``key`` (torch has no uint64 math)."""
    check_key(key)
    return key - 2**64 if key >= 2**63 else key


class PRF(ABC):
    """A watermark PRF version on the CPU (numpy): what detection needs.

    Samplers that work on tensors use the version's torch/Triton implementation beside it
    (for ``philox4x32-10-v1``: :mod:`watermark.prf.philox_torch`, :mod:`watermark.kernels.philox`).
    """

    version: ClassVar[str]
    """The spec's ``prf`` value, e.g. ``philox4x32-10-v1``."""

    key_bits: ClassVar[int] = 64
    """The secret's size: 64 (keys are uint64 arrays) or 256 (keys are Python ints)."""

    @abstractmethod
    def words(self, keys: np.ndarray | np.uint64, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """keys (a uint64 scalar or per-row [N]), contexts [N, w] (-1 allowed) and tokens [N]
        give the N words (uint64 holding 32-bit values)."""

    @abstractmethod
    def uniforms_from_words(self, words: np.ndarray) -> np.ndarray:
        """Words -> float32 uniforms in (0, 1), never 0 or 1."""

    def uniforms(self, keys: np.ndarray | np.uint64, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.uniforms_from_words(self.words(keys, contexts, tokens))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(version={self.version!r})"
