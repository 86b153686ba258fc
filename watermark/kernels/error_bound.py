"""The stage-1 approximation error, measured on a device over all 2^24 uniforms."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from watermark.kernels.approximation import (INTERPRET, NOISE_ERROR_BOUND, RATIO_ERROR_BOUND,
                                             inverse_exponential_approx, noise_approx)


@triton.jit
def _approximation_kernel(noise_ptr, ratio_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    words = offs.to(tl.uint32) << 8
    tl.store(noise_ptr + offs, noise_approx(words), mask=offs < n)
    tl.store(ratio_ptr + offs, inverse_exponential_approx(words), mask=offs < n)


def measure_approximation_error(device: torch.device | str) -> dict[str, float]:
    """Max |g~ - g| and max |r~ E - 1| over all 2^24 uniforms, with the kernels' own
    approximation on ``device``, against float64 evaluation of the reference formulas."""
    from watermark import noise as gumbel_noise
    from watermark.prf import philox_torch

    device = torch.device(device)
    n = 2**24
    noise = torch.empty(n, dtype=torch.float32, device=device)
    ratio = torch.empty(n, dtype=torch.float32, device=device)
    block = 65536 if INTERPRET else 1024  # the interpreter pays per program, the device per register
    _approximation_kernel[(triton.cdiv(n, block),)](noise, ratio, n, BLOCK=block)
    words = torch.arange(n, dtype=torch.int64, device=device) << 8
    u = philox_torch.uniforms_from_words_torch(words)
    g = gumbel_noise.noise_from_uniforms(u).to(torch.float64)
    e = gumbel_noise.exponentials_from_uniforms(u).to(torch.float64)
    noise_error = (noise.to(torch.float64) - g).abs().max().item()
    ratio_error = (ratio.to(torch.float64) * e - 1.0).abs().max().item()
    return {
        "noise_max_abs_error": noise_error,
        "noise_error_bound": NOISE_ERROR_BOUND,
        "ratio_max_rel_error": ratio_error,
        "ratio_error_bound": RATIO_ERROR_BOUND,
        "within_bounds": bool(noise_error <= NOISE_ERROR_BOUND and ratio_error <= RATIO_ERROR_BOUND),
    }
