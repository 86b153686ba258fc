"""Watermark PRFs: one module per version, looked up by the spec's ``prf`` name.

* :mod:`watermark.prf.base` -- the interface and the 64-bit key conventions all versions share;
* :mod:`watermark.prf.versions` -- the version names a spec may use;
* :mod:`watermark.prf.philox` -- ``philox4x32-10-v1`` (numpy and plain ints; no torch);
* :mod:`watermark.prf.philox_torch` -- the same PRF on torch tensors, for the samplers
  (imported only where tensors are, so detection and the CLI never load torch);
* :mod:`watermark.prf.hmac_philox` -- ``hmac-sha256-philox-v1``: 256-bit keys, HMAC-SHA-256
  per context then Philox's token stage (the default for new keys, :data:`NEW_KEY`);
* :mod:`watermark.prf.hmac_sha256` -- ``hmac-sha256-v1``: vLLM's ``hmac_sha256`` PRF, bit for bit;
* :mod:`watermark.prf.sha256` / :mod:`watermark.prf.hmac_compiled` -- HMAC midstates and the
  compiled (numba) passes both 256-bit versions share.

Adding a version: one module with a :class:`~watermark.prf.base.PRF` subclass, its golden
vectors, its name in :mod:`watermark.prf.versions` and one branch in :func:`lookup`.
"""

from __future__ import annotations

from watermark.prf.base import MAX_KEY, MAX_KEY_256, PRF, check_key, derive_key, derive_keys, secret_bytes, to_signed64
from watermark.prf.versions import HMAC_PHILOX_V1, HMAC_SHA256_V1, KEY_BITS, NAMES, PHILOX_V1, VLLM_NAMES

__all__ = ["MAX_KEY", "MAX_KEY_256", "NAMES", "PHILOX_V1", "HMAC_PHILOX_V1", "HMAC_SHA256_V1", "KEY_BITS", "VLLM_NAMES",
           "PRF", "DEFAULT", "NEW_KEY", "canonical_name", "check_key", "derive_key", "derive_keys", "key_bits",
           "lookup", "secret_bytes", "to_signed64"]

DEFAULT = PHILOX_V1
"""The version a spec names when it names none (every spec written before 256-bit keys, and
vLLM's configs): such keys keep working unchanged."""

NEW_KEY = HMAC_PHILOX_V1
"""The version a new key gets when its creator names none (:func:`keys.lifecycle.build_spec`)."""


def key_bits(name: str) -> int:
    """The secret size, in bits, of the PRF ``name``: 64 or 256."""
    return KEY_BITS[canonical_name(name)]


def canonical_name(name: str) -> str:
    """The version string for a ``prf`` name (``philox`` is vLLM's name for ``philox4x32-10-v1``)."""
    if name not in NAMES:
        raise ValueError(f"unknown prf: {name!r}; expected one of {sorted(NAMES)}")
    return NAMES[name]


def lookup(name: str) -> PRF:
    """The PRF implementation a spec's ``prf`` names. Implementations load here, so naming
    a PRF (a spec, the key store) costs no numpy."""
    version = canonical_name(name)
    if version == PHILOX_V1:
        from watermark.prf import philox

        return philox.PHILOX
    if version == HMAC_PHILOX_V1:
        from watermark.prf import hmac_philox

        return hmac_philox.HMAC_PHILOX
    if version == HMAC_SHA256_V1:
        from watermark.prf import hmac_sha256

        return hmac_sha256.HMAC_SHA256
    raise ValueError(f"unknown prf: {name!r}; expected one of {sorted(NAMES)}")  # pragma: no cover
