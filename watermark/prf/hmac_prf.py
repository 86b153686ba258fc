"""What the two HMAC-SHA-256 PRFs (``hmac-sha256-philox-v1``, ``hmac-sha256-v1``) share on the
CPU: 256-bit int keys given once or one per row, the compiled passes over HMAC midstates where
numba is present and the hashlib reference where it is not, and Philox's words-to-uniforms map
(both PRFs' words are 32-bit)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from watermark.prf import hmac_compiled, philox
from watermark.prf.base import PRF, check_key

KEY_BITS = 256


def per_row_keys(keys, n: int) -> list[int]:
    """``keys`` (one int, or one per row) as n checked 256-bit keys."""
    if isinstance(keys, int):
        return [check_key(keys, KEY_BITS)] * n
    keys = [int(k) for k in keys]
    if len(keys) != n:
        raise ValueError("keys must be one int or one per row")
    return [check_key(k, KEY_BITS) for k in keys]


def per_key(tokens_by_key, k: int) -> list:
    """Tokens [P] for every one of k keys, or one array per key as given."""
    if isinstance(tokens_by_key, np.ndarray) and tokens_by_key.ndim == 1:
        return [tokens_by_key] * k
    return list(tokens_by_key)


class HmacPRF(PRF):
    """A PRF whose words come from each key's HMAC midstates. Subclasses name their hashlib
    reference, their cached midstates and their three compiled passes (rows, uniforms of many
    keys, words of many keys) as static methods."""

    key_bits = KEY_BITS
    reference: Callable[..., np.ndarray]
    midstates: Callable[[int], tuple[int, ...]]
    compiled_rows: Callable[..., np.ndarray]
    compiled_uniforms_many: Callable[..., np.ndarray]
    compiled_words_many: Callable[..., np.ndarray]

    def _table(self, keys: Sequence[int]):
        return hmac_compiled.midstates_table(type(self).midstates, keys)

    def words(self, keys, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        contexts = np.asarray(contexts, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        if hmac_compiled.compiled() is None:  # pragma: no cover - exercised where numba is missing
            return type(self).reference(keys, contexts, tokens)
        return type(self).compiled_rows(self._table(per_row_keys(keys, len(tokens))), contexts, tokens)

    def uniforms_from_words(self, words: np.ndarray) -> np.ndarray:
        return philox.uniforms_from_words_numpy(words)

    def uniforms_many(self, keys: Sequence[int], contexts: np.ndarray, tokens_by_key) -> np.ndarray:
        """float32 uniforms [K, P]: each key over the same contexts, tokens [P] or one array
        per key (the detector's batched form)."""
        if hmac_compiled.compiled() is None:  # pragma: no cover - exercised where numba is missing
            return np.stack([self.uniforms(k, contexts, t) for k, t in zip(keys, per_key(tokens_by_key, len(keys)))])
        return type(self).compiled_uniforms_many(self._table(keys), contexts, tokens_by_key)

    def words_many(self, keys: Sequence[int], contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """uint32 words [K, P]: each key over the same contexts and tokens (the many-key screen)."""
        if hmac_compiled.compiled() is None:  # pragma: no cover - exercised where numba is missing
            return np.stack([type(self).reference(k, contexts, tokens).astype(np.uint32) for k in keys])
        return type(self).compiled_words_many(self._table(keys), contexts, tokens)
