"""Warm-up registry: the compiled variants each kernel can be launched with, and
:func:`warm_up`, which compiles all of them at engine start.

Triton compiles a kernel the first time it meets a new *variant* (a new dtype of a
pointer, a new value of a compile-time constant, an integer that becomes 1 or a multiple
of 16...). Compiling takes seconds; on a user's first request that is a stall. So every
size, stride, count and per-row tensor argument is marked ``do_not_specialize``, the
launchers fix every pointer dtype and copy the rare misaligned view, and every launch goes
through :func:`watermark.kernels.launch.launch`, which names the variant it selects. What
is left selects a variant on purpose, and the variants are enumerated *by construction*
from what the dispatchers can choose:

* the value dtype (float32, bfloat16, float16: anything else is converted to float32);
* the row-stride alignment: ``STRIDE_MULT`` 16 (rows 16 elements apart: vector loads) or 1;
* the launch configuration: every entry of ``gumbel.DISPATCH_CONFIGS`` (vocabulary
  kernels) and ``speculative.DISPATCH_CONFIGS`` (verification): tile shape, warps,
  register cap, compaction flag. The dispatchers (watermark.sampler, watermark.gumbel,
  watermark.speculative, the engines) pass no configuration, so today each holds one.

Everything else is a run-time value read by the kernel: batch size, vocabulary size,
stride values, per-row temperature (greedy rows and T == 1 included), single or dual
key (alpha), watermarked or ordinary-stream rows, context width (1..16), keys, positions,
draft count k, dedup scope and window.
``tests/watermark/kernels/test_registry.py`` sweeps the dispatchers on the CPU (launches
recorded, not run) and fails if any reaches a variant not declared here; on a GPU it
checks that after :func:`warm_up` a mixed workload compiles nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from watermark.kernels import dedup, gumbel, launch, speculative
from watermark.kernels.gumbel import LaunchConfig

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Runtime values, never a recompile: batch size, vocabulary size, stride values, temperature
# (greedy rows, T == 1), single or dual key, watermarked or ordinary-stream rows, context
# width 1..16, keys, positions, draft count k, dedup scope and window.


@dataclass(frozen=True)
class Specialisation:
    """One compiled variant of one kernel."""

    kernel: str
    dtype: torch.dtype | None
    """Logit / probability dtype; None for kernels without one (dedup)."""
    aligned: bool
    """Row strides are multiples of 16 elements (STRIDE_MULT 16)."""
    config: LaunchConfig | None = None
    """Launch configuration (None for dedup kernels)."""

    def variant(self) -> launch.Variant:
        """The variant a launch of this specialisation selects (as launch.launch names it)."""
        mult = 16 if self.aligned else 1
        if self.kernel == "verify":
            constexprs, options = speculative.compile_time_args(self.config, mult)
        elif self.config is not None:
            constexprs, options = gumbel.compile_time_args(self.config, mult)
        else:
            constexprs, options = {}, dedup.DEDUP_OPTIONS
        return launch.variant(self.kernel, self.dtype, constexprs, options)


KERNELS = {
    "gumbel_sample": gumbel._gumbel_sample_kernel,
    "gumbel_argmax": gumbel._gumbel_argmax_kernel,
    "exponential_race": gumbel._exponential_race_kernel,
    "verify": speculative._verify_kernel,
    "dedup_append": dedup._dedup_append_kernel,
    "dedup_query": dedup._dedup_query_kernel,
    "dedup_step": dedup._dedup_step_kernel,
}
VOCABULARY_KERNELS = {"gumbel_sample": gumbel.DISPATCH_CONFIGS, "gumbel_argmax": gumbel.DISPATCH_CONFIGS,
                      "exponential_race": gumbel.DISPATCH_CONFIGS, "verify": speculative.DISPATCH_CONFIGS}


def specialisations() -> tuple[Specialisation, ...]:
    """Every variant :func:`warm_up` compiles: kernel x reachable config x dtype x alignment."""
    out = []
    for name, configs in VOCABULARY_KERNELS.items():
        out += [Specialisation(name, dtype, aligned, config)
                for config in configs for dtype in DTYPES for aligned in (True, False)]
    out += [Specialisation(name, None, True) for name in ("dedup_append", "dedup_query", "dedup_step")]
    return tuple(out)


def declared_variants() -> frozenset[launch.Variant]:
    return frozenset(spec.variant() for spec in specialisations())


@dataclass(frozen=True)
class WarmUpReport:
    specialisations: tuple[Specialisation, ...]
    seconds: float
    compiled: dict
    """Compiled variants per kernel after the warm-up (None where not countable)."""


def _launch(spec: Specialisation, device: torch.device, dd: dedup.GpuDeduper) -> None:
    """Launch ``spec`` once on tiny inputs (vocabulary 64 is aligned, 65 is not)."""
    vocab = 64 if spec.aligned else 65
    rows = 2
    keys = torch.arange(1, rows + 1, dtype=torch.int64, device=device)
    if spec.kernel == "gumbel_sample":
        logits = torch.randn(rows, vocab, device=device).to(spec.dtype)
        gumbel.gumbel_sample(
            logits, temperature=torch.tensor([1.0, 0.0], device=device), key_a=keys, key_b=keys + 2,
            alpha=torch.tensor([0.5, 0.0], device=device), contexts=torch.zeros(rows, 16, dtype=torch.int64,
                                                                                 device=device),
            widths=torch.tensor([4, 16], dtype=torch.int32, device=device),
            watermark=torch.tensor([True, False], device=device), stream_keys=keys + 4,
            positions=torch.zeros(rows, dtype=torch.int64, device=device), config=spec.config)
    elif spec.kernel in ("gumbel_argmax", "exponential_race"):
        values = torch.rand(rows, vocab, device=device).to(spec.dtype)
        states = torch.zeros(rows, 4, dtype=torch.int64, device=device)
        getattr(gumbel, spec.kernel)(values, keys, states, config=spec.config)
    elif spec.kernel == "verify":
        k = 2
        # V = 64 gives strides (V, (k+1) V) that are multiples of 16; 65 does not.
        p = torch.softmax(torch.randn(rows, k + 1, vocab, device=device), -1).to(spec.dtype)
        q = torch.softmax(torch.randn(rows, k, vocab, device=device), -1).to(spec.dtype)
        speculative.verify(
            p, q, torch.zeros(rows, k, dtype=torch.int64, device=device), key_b=keys, key_coin=keys + 1,
            keyed_coin=torch.tensor([True, False], device=device),
            contexts=torch.zeros(rows, k + 1, 16, dtype=torch.int64, device=device),
            widths=torch.tensor([1, 4], dtype=torch.int32, device=device),
            watermark=torch.ones(rows, k + 1, dtype=torch.bool, device=device),
            greedy=torch.tensor([False, True], device=device), stream_keys=keys + 2,
            positions=torch.zeros(rows, dtype=torch.int64, device=device), config=spec.config)
    elif spec.kernel == "dedup_append":
        dd.append(torch.tensor([0], device=device), torch.tensor([[5, 6]], device=device))
    elif spec.kernel == "dedup_query":
        dd.repeated(torch.tensor([0], device=device), torch.tensor([[5, 6]], device=device))
    elif spec.kernel == "dedup_step":
        dd.step(torch.tensor([0], device=device), torch.tensor([1], dtype=torch.int8, device=device),
                torch.tensor([7], dtype=torch.int64, device=device))
    else:  # pragma: no cover - the table above is closed
        raise ValueError(f"unknown kernel: {spec.kernel}; expected one of {sorted(KERNELS)}")


def warm_up(device: torch.device | str = "cuda") -> WarmUpReport:
    """Compile (or load from Triton's disk cache) every variant in :func:`specialisations`."""
    device = torch.device(device)
    start = time.perf_counter()
    dd = dedup.GpuDeduper(1, 8, device)
    dd.open(0, width=2, scope="single_turn", max_history=None)
    specs = specialisations()
    with launch.recording() as seen:
        for spec in specs:
            _launch(spec, device, dd)
    missing = declared_variants() - seen.variants
    if missing:  # the warm-up launch of a specialisation selected another variant: a registry bug
        raise RuntimeError(f"warm-up did not reach declared variants: {sorted(map(str, missing))}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return WarmUpReport(specialisations=specs, seconds=time.perf_counter() - start, compiled=compiled_variants())


def compiled_variants() -> dict:
    """Number of compiled variants held by each kernel's in-memory JIT cache (all devices);
    None where the Triton version keeps no countable cache (or under the interpreter)."""
    counts = {}
    for name, fn in KERNELS.items():
        caches = getattr(fn, "device_caches", None)
        if caches is None:
            counts[name] = None
            continue
        try:
            counts[name] = sum(len(entry[0]) for entry in caches.values())
        except (TypeError, IndexError, KeyError):
            counts[name] = None
    return counts


class CompileWatch:
    """Records kernels compiled while active, through Triton's post-compile hook
    (``triton.knobs.runtime.jit_post_compile_hook``, Triton >= 3.4); ``supported`` is False
    on versions without it. Use as a context manager."""

    def __init__(self) -> None:
        self.compiled: list[str] = []
        self.supported = False
        self._previous = None

    def _hook(self, *args, **kwargs):
        name = kwargs.get("repr") or (getattr(kwargs.get("fn"), "name", None)) or "kernel"
        self.compiled.append(str(name))
        if self._previous is not None:
            return self._previous(*args, **kwargs)
        return None

    def __enter__(self) -> "CompileWatch":
        try:
            import triton.knobs as knobs

            self._previous = knobs.runtime.jit_post_compile_hook
            knobs.runtime.jit_post_compile_hook = self._hook
            self.supported = True
        except (ImportError, AttributeError):
            self.supported = False
        return self

    def __exit__(self, *exc) -> None:
        if self.supported:
            import triton.knobs as knobs

            knobs.runtime.jit_post_compile_hook = self._previous
