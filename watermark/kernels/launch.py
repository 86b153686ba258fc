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


# --------------------------------------------------------------------------- bound launches

try:  # Triton >= 3.4: launch hooks live in knobs (JITFunction.run passes them to the launcher)
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: no bound launches
    _knobs = None


def _hook_active(hook) -> bool:
    """A launch hook is set: not None and, for Triton's HookChain (the default since 3.4,
    never None), holding at least one call."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return True if calls is None else bool(calls)


def _hooks_set() -> bool:
    runtime = _knobs.runtime
    return _hook_active(runtime.launch_enter_hook) or _hook_active(runtime.launch_exit_hook)


class Prepared:
    """One kernel launch bound once, relaunched with only some arguments changed.

    ``kernel[grid](*args, ...)`` spends most of its host time in Triton's Python launch
    path: binding the arguments, computing the specialisation key (one call per argument),
    looking the compiled variant up, and (for each tensor) ``data_ptr()`` plus a driver
    query of the pointer. A decode step that launches the same variant over the same
    buffers every time needs none of it: :meth:`__call__` hands the compiled kernel's
    launcher the arguments directly, pointers as integers. Only the arguments named in
    ``replace`` change (a new logits tensor, say); the caller keeps every bound tensor
    alive and unchanged in dtype and alignment (checked for the replaced ones).

    Falls back to :func:`launch` (same variant, same effect) where binding is not possible
    or not wanted: Triton's interpreter, a CPU device, launch hooks set (profilers), a
    recorder active (the registry's sweep), or a Triton whose launcher differs.
    """

    def __init__(self, kernel, name: str, grid: tuple, args: tuple, *, dtype=None, constexprs: dict | None = None,
                 options: dict | None = None, aligned: tuple[int, ...] = ()) -> None:
        self.kernel, self.name, self.grid = kernel, name, tuple(grid) + (1,) * (3 - len(grid))
        self.args = list(args)
        self.dtype, self.constexprs, self.options = dtype, dict(constexprs or {}), dict(options or {})
        self.aligned = tuple(aligned)
        self._launcher = None
        self.fast_calls = 0  # launches that bypassed Triton's Python launch path
        self._fast: list = []
        self._positions: list[int] = []  # launcher slot of each positional argument
        for index in self.aligned:
            _check_aligned(name, self.args[index])
        try:
            self._bind()
        except Exception:  # noqa: BLE001 - any mismatch: the ordinary launch path, same effect
            self._launcher = None

    @property
    def bound(self) -> bool:
        """True when calls bypass Triton's Python launch path."""
        return self._launcher is not None

    def _bind(self) -> None:
        import torch

        tensors = [a for a in self.args if isinstance(a, torch.Tensor)]
        if _knobs is None or not tensors or tensors[0].device.type != "cuda" or not hasattr(self.kernel, "warmup"):
            return
        params = getattr(self.kernel, "params", None)
        if params is None or len(params) != len(self.args) + len(self.constexprs):
            return
        with torch.cuda.device(tensors[0].device):
            compiled = self.kernel.warmup(*self.args, grid=self.grid, **self.constexprs, **self.options)
        fast, positional = [], iter(range(len(self.args)))
        for param in params:
            name = param.name
            if name in self.constexprs:
                if not getattr(param, "is_constexpr", True):
                    return
                fast.append(self.constexprs[name])
            else:
                index = next(positional)
                self._positions.append(len(fast))
                fast.append(_launch_value(self.args[index]))
        self._fast = fast
        self._device = tensors[0].device.index if tensors[0].device.index is not None else torch.cuda.current_device()
        from triton.runtime import driver

        self._stream = driver.active.get_current_stream
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        init = getattr(compiled, "_init_handles", None)
        if init is not None:  # loads the module: function and launcher exist from here on
            init()
        launcher = compiled.run
        if not callable(launcher) or compiled.function is None:
            return
        self._function, self._metadata = compiled.function, compiled.packed_metadata
        self._launcher = launcher

    def __call__(self, replace: dict[int, object] | None = None) -> None:
        """Launch; ``replace`` maps positional-argument indexes to new values."""
        if replace:
            for index, value in replace.items():
                if index in self.aligned:
                    _check_aligned(self.name, value)
                self.args[index] = value
                if self._launcher is not None:
                    self._fast[self._positions[index]] = _launch_value(value)
        if self._launcher is None or _ACTIVE or _hooks_set():
            launch(self.kernel, self.name, self.grid, tuple(self.args), dtype=self.dtype, constexprs=self.constexprs,
                   options=self.options)
            return
        g0, g1, g2 = self.grid
        self.fast_calls += 1
        self._launcher(g0, g1, g2, self._stream(self._device), self._function, self._metadata, None, None, None,
                       *self._fast)


def _launch_value(value):
    data_ptr = getattr(value, "data_ptr", None)
    return data_ptr() if data_ptr is not None else value


def _check_aligned(name: str, tensor) -> None:
    if tensor.numel() and tensor.data_ptr() % 16:
        raise ValueError(f"{name}: a specialised pointer argument is not 16-byte aligned "
                         "(the launcher must copy such a view first)")
