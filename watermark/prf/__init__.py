"""Watermark PRFs: one module per version, looked up by the spec's ``prf`` name.

* :mod:`watermark.prf.base` -- the interface and the 64-bit key conventions all versions share;
* :mod:`watermark.prf.versions` -- the version names a spec may use;
* :mod:`watermark.prf.philox` -- ``philox4x32-10-v1`` (numpy and plain ints; no torch);
* :mod:`watermark.prf.philox_torch` -- the same PRF on torch tensors, for the samplers
  (imported only where tensors are, so detection and the CLI never load torch).

Adding a version: one module with a :class:`~watermark.prf.base.PRF` subclass, its golden
vectors, its name in :mod:`watermark.prf.versions` and one branch in :func:`lookup`.
"""

from __future__ import annotations

from watermark.prf.base import MAX_KEY, PRF, check_key, derive_key, derive_keys, to_signed64
from watermark.prf.versions import NAMES, PHILOX_V1

__all__ = ["MAX_KEY", "NAMES", "PHILOX_V1", "PRF", "DEFAULT", "canonical_name", "check_key", "derive_key", "derive_keys",
           "lookup", "to_signed64"]

DEFAULT = PHILOX_V1
"""The version a spec names when it names none."""


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
    raise ValueError(f"unknown prf: {name!r}; expected one of {sorted(NAMES)}")  # pragma: no cover
