"""Stage 1 of the exact race: fast float32 approximations of the Gumbel and exponential
noise and their error budget, and the exact float64 values of stage 2.

Reference arithmetic (:mod:`watermark.gumbel`): g = float32(-log(-log(float64(u)))) and
E = float32(-log(float64(u))). The approximations g~ and r~ = 1 / E~ differ from the exact
float32 g and 1 / E by at most ``NOISE_ERROR_BOUND`` (absolute) and ``RATIO_ERROR_BOUND``
(relative) -- bounds checked over all 2^24 uniforms on the device by
:func:`watermark.kernels.error_bound.measure_approximation_error`. :mod:`watermark.kernels.race`
explains why racing exactly the tokens inside the window misses nothing.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from watermark.kernels import philox

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off", "no")
# Hardware approximations (MUFU lg2/rcp) on the device; exact numpy functions under the
# interpreter, which cannot run inline assembly. Either way the bound below is measured.
FAST_MATH = tl.constexpr(not INTERPRET)

LN2 = tl.constexpr(0.6931471805599453)
TWO_M24 = tl.constexpr(2.0**-24)
# d = 1 - u is exact below 2^-8 (mantissas above 2^24 - 2^16); -log(1 - d) ~= d + d^2 / 2
# there (relative error below d^2 / 3 <= 5.1e-6), the hardware log above (where its
# absolute error, ~2^-22, is at most ~5e-5 relative to -log u >= 2^-8).
SERIES_LIMIT = tl.constexpr(2**16)

# Stage-1 error budget: the measured max |g~ - g| must stay below NOISE_ERROR_BOUND and the
# measured max |r~ E - 1| below RATIO_ERROR_BOUND; the candidate window is 4x the bound.
NOISE_ERROR_BOUND = 2.0**-12
RATIO_ERROR_BOUND = 2.0**-12
LOG_WINDOW = tl.constexpr(4 * NOISE_ERROR_BOUND)
RATIO_WINDOW = tl.constexpr(4 * RATIO_ERROR_BOUND)
# Float32 rounding of a = l + g~ (or w * r~), relative to |M|: 2^-20 covers two roundings.
ROUNDING = tl.constexpr(2.0**-20)
# Below this the float32 scores w * r~ may be subnormal (or flushed to zero): no relative
# error bound holds, so every positive weight becomes a candidate (pathological rows only).
RATIO_NORMAL = tl.constexpr(2.0**-125)


# --------------------------------------------------------------------------- fast math


@triton.jit
def _lg2(x):
    if FAST_MATH:
        y = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.log2(x)
    return y


@triton.jit
def _rcp(x):
    if FAST_MATH:
        y = tl.inline_asm_elementwise("rcp.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = 1.0 / x
    return y


@triton.jit
def exponential_approx(word):
    """E~ ~= -ln(u) for the PRF uniform u of ``word`` (uint32), float32, any shape."""
    mant = (word >> 8).to(tl.int32)
    # u >= 2^-24: -log2(u) from the hardware log.
    x = (mant + 1).to(tl.float32) * TWO_M24
    far = -_lg2(x) * LN2
    # u near 1: d = 1 - u = (2^24 - m) 2^-24 exactly (u is (m + 1) 2^-24 minus one ulp),
    # built from the integer without a conversion; -ln(1 - d) = d + d^2/2 + ...
    nd = 16777216 - mant
    d = tl.fma((nd | 0x4B000000).to(tl.float32, bitcast=True), TWO_M24, -0.5)
    near = tl.fma(d * 0.5, d, d)
    return tl.where(nd < SERIES_LIMIT, near, far)


@triton.jit
def noise_approx(word):
    """g~ ~= -log(-log(u)), float32."""
    return -_lg2(exponential_approx(word)) * LN2


@triton.jit
def inverse_exponential_approx(word):
    """r~ ~= 1 / E, float32."""
    return _rcp(exponential_approx(word))


@triton.jit
def noise_score(l, u):
    """Approximate Gumbel score a = l + g~ (float32)."""
    return l - _lg2(exponential_approx(u)) * LN2


@triton.jit
def ratio_score(w, u):
    """Approximate exponential score a = w r~ (float32)."""
    return w * _rcp(exponential_approx(u))


# --------------------------------------------------------------------------- exact values


@triton.jit
def exact_noise(mant):
    """The reference g = float32(-log(-log(float64(u)))) for a uniform's 24-bit mantissa (int32)."""
    u = philox.uniform(mant.to(tl.uint32) << 8)
    return (-tl.log(-tl.log(u.to(tl.float64)))).to(tl.float32)


@triton.jit
def exact_exponential(mant):
    """The reference E = float32(-log(float64(u)))."""
    u = philox.uniform(mant.to(tl.uint32) << 8)
    return (-tl.log(u.to(tl.float64))).to(tl.float32)


@triton.jit
def exact_ratio(w, mant):
    """float32(w / E): float64 division then one rounding is the correctly rounded float32
    quotient (53 >= 2 * 24 + 2 bits), whatever the float32 division mode of the compiler."""
    return (w.to(tl.float64) / exact_exponential(mant).to(tl.float64)).to(tl.float32)
