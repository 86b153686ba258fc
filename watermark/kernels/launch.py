"""The one way the launchers start a kernel, and the name of the variant each launch selects.

Triton keeps one compiled binary per *variant* of a kernel: the dtypes of its pointer
arguments, the 16-byte alignment of those it specialises on, its compile-time constants
and its launch options (warps, register cap). Every launcher in this package calls
:func:`launch`, which computes that :class:`Variant` from the same values it passes to the
kernel, so the warm-up registry (:mod:`watermark.kernels.registry`) can declare variants
in exactly the terms the launchers produce, and a test can record what the dispatchers
reach (:func:`recording`, optionally without launching anything) and compare.

Alignment: every pointer a kernel specialises on must start 16-byte aligned (launchers
copy a misaligned view first; :func:`launch` refuses one), so pointer alignment never
selects a variant. Sizes, strides and per-row tensors are ``do_not_specialize``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class Variant:
    """One compiled variant: kernel, value dtype, compile-time constants and launch options."""

    kernel: str
    dtype: str | None
    """Name of the value dtype ("float32", "bfloat16", "float16"); None for dedup kernels."""
    constants: tuple[tuple[str, object], ...]
    """Compile-time constants and launch options, sorted by name."""

    def get(self, name: str, default=None):
        return dict(self.constants).get(name, default)


def variant(kernel: str, dtype, constexprs: dict, options: dict) -> Variant:
    name = None if dtype is None else str(dtype).removeprefix("torch.")
    return Variant(kernel, name, tuple(sorted({**constexprs, **options}.items())))


@dataclass
class Recorder:
    dry_run: bool
    variants: set[Variant] = field(default_factory=set)


_ACTIVE: list[Recorder] = []


@contextlib.contextmanager
def recording(dry_run: bool = False) -> Iterator[Recorder]:
    """Record the variants of every launch made inside the block; ``dry_run`` skips the
    launches themselves (so the dispatchers can be swept on the CPU, outputs unwritten)."""
    recorder = Recorder(dry_run=dry_run)
    _ACTIVE.append(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.remove(recorder)


def launch(kernel, name: str, grid: tuple, args: tuple, *, dtype=None, constexprs: dict | None = None,
           options: dict | None = None, aligned: tuple = ()) -> None:
    """``kernel[grid](*args, **constexprs, **options)``, recorded; ``aligned``: the tensors
    passed to pointer arguments the kernel specialises on (checked 16-byte aligned)."""
    constexprs = constexprs or {}
    options = options or {}
    for tensor in aligned:
        if tensor.numel() and tensor.data_ptr() % 16:
            raise ValueError(f"{name}: a specialised pointer argument is not 16-byte aligned "
                             "(the launcher must copy such a view first)")
    if _ACTIVE:
        chosen = variant(name, dtype, constexprs, options)
        for recorder in _ACTIVE:
            recorder.variants.add(chosen)
        if any(recorder.dry_run for recorder in _ACTIVE):
            return
    kernel[grid](*args, **constexprs, **options)
