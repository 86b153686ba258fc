"""Gumbel noise and exponentials from PRF uniforms: the arithmetic every sampler shares.

The torch reference, the CPU fast path and the Triton kernels all turn a PRF's float32
uniform u into noise the same way, so that they pick bit-identical tokens:

* g = float32(-log(-log(float64(u)))): computed in float64 and rounded once, so one-ulp
  differences between math libraries almost never survive the rounding;
* E = float32(-log(float64(u))) for the ratio form argmax w / E.

Because u lies on a 24-bit grid (never 0 or 1), NOISE_MIN <= g <= NOISE_MAX and
E >= EXPONENTIAL_MIN: the bounds that exact candidate pruning rests on.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from watermark.prf import philox

_U_MIN = float(np.float32(1.0 / philox.UNIFORM_DENOMINATOR))
_U_MAX = float(np.float32(2.0**24 / philox.UNIFORM_DENOMINATOR))
NOISE_MIN = float(np.float32(-math.log(-math.log(_U_MIN))))
NOISE_MAX = float(np.float32(-math.log(-math.log(_U_MAX))))
EXPONENTIAL_MIN = float(np.float32(-math.log(_U_MAX)))


def noise_from_uniforms(uniforms: torch.Tensor) -> torch.Tensor:
    """float32 uniforms -> float32 Gumbel noise, through float64 (see module docstring)."""
    u = uniforms.to(torch.float64)
    return (-torch.log(-torch.log(u))).to(torch.float32)


def noise_from_uniforms_numpy(uniforms: np.ndarray) -> np.ndarray:
    u = uniforms.astype(np.float64)
    return (-np.log(-np.log(u))).astype(np.float32)


def exponentials_from_uniforms(uniforms: torch.Tensor) -> torch.Tensor:
    """float32 uniforms -> float32 Exp(1) draws E = -log u (for argmax p / E races)."""
    return (-torch.log(uniforms.to(torch.float64))).to(torch.float32)


def exponentials_from_uniforms_numpy(uniforms: np.ndarray) -> np.ndarray:
    return (-np.log(uniforms.astype(np.float64))).astype(np.float32)
