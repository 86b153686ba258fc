"""What every watermark PRF is: 64-bit keys, sub-key derivation, and the interface.

A PRF maps (key, context, token) to a 32-bit word and the word to a float32 uniform in
(0, 1). The key conventions here (a 64-bit unsigned key; sub-keys by SHA-256) belong to
the watermark scheme, not to one PRF, so every PRF version shares them.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the interface names numpy types; only implementations load numpy
    import numpy as np

MAX_KEY = 2**64 - 1


def check_key(key: int) -> int:
    """Return ``key`` if it is a valid 64-bit PRF key, else raise ValueError."""
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= MAX_KEY:
        raise ValueError("a watermark key must be an integer in [0, 2**64 - 1]")
    return key


def derive_key(key: int, domain: str | bytes) -> int:
    """Sub-key: the first 8 bytes (big-endian) of SHA-256(domain || key as 8 bytes big-endian)."""
    check_key(key)
    tag = domain.encode() if isinstance(domain, str) else domain
    digest = hashlib.sha256(tag + key.to_bytes(8, "big")).digest()
    return int.from_bytes(digest[:8], "big")


def derive_keys(key: int, tags: tuple[bytes, ...], sub_tags: tuple[bytes, ...] = ()) -> list[tuple[int, ...]]:
    """For each tag: ``(k, *(derive_key(k, sub) for sub in sub_tags))`` with ``k =
    derive_key(key, tag)``, the key checked once. Opening a store derives 3 x 16 sub-keys for
    each `diverse` key (its salted secrets, then their key A and key B); one
    :func:`derive_key` call at a time, the calls cost several times the SHA-256s."""
    check_key(key)
    sha256, from_bytes = hashlib.sha256, int.from_bytes
    raw = key.to_bytes(8, "big")
    firsts = [sha256(tag + raw).digest()[:8] for tag in tags]  # each derived key's 8 bytes, big-endian
    columns = [[from_bytes(first, "big") for first in firsts]]
    for sub in sub_tags:
        columns.append([from_bytes(sha256(sub + first).digest()[:8], "big") for first in firsts])
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
