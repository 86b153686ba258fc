"""Watermark PRFs: one module per version, looked up by the spec's ``prf`` name.

* :mod:`watermark.prf.base` -- the interface and the 64-bit key conventions all versions share;
* :mod:`watermark.prf.philox` -- ``philox4x32-10-v1`` (numpy and plain ints; no torch);
* :mod:`watermark.prf.philox_torch` -- the same PRF on torch tensors, for the samplers
  (imported only where tensors are, so detection and the CLI never load torch).

Adding a version: one module with a :class:`~watermark.prf.base.PRF` subclass, its golden
vectors, and one line in :func:`lookup`.
"""

from __future__ import annotations

from watermark.prf import philox
from watermark.prf.base import MAX_KEY, PRF, check_key, derive_key, to_signed64

__all__ = ["MAX_KEY", "NAMES", "PRF", "DEFAULT", "canonical_name", "check_key", "derive_key", "lookup",
           "to_signed64"]

DEFAULT = philox.VERSION
"""The version a spec names when it names none."""

NAMES: dict[str, str] = {philox.NAME: philox.VERSION, philox.VERSION: philox.VERSION}
"""Every accepted ``prf`` name (versions and vLLM's short names) -> its version."""


def canonical_name(name: str) -> str:
    """The version string for a ``prf`` name (``philox`` is vLLM's name for ``philox4x32-10-v1``)."""
    if name not in NAMES:
        raise ValueError(f"unknown prf: {name!r}; expected one of {sorted(NAMES)}")
    return NAMES[name]


def lookup(name: str) -> PRF:
    """The PRF implementation a spec's ``prf`` names."""
    version = canonical_name(name)
    if version == philox.VERSION:
        return philox.PHILOX
    raise ValueError(f"unknown prf: {name!r}; expected one of {sorted(NAMES)}")  # pragma: no cover
