"""What the samplers return, and the routes that say which key each token was drawn under.

A leaf module: the torch references (:mod:`watermark.sampler`, :mod:`watermark.speculative`)
and the Triton kernels (:mod:`watermark.kernels`) both return these types, so neither
imports the other for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROUTE_GREEDY = 0
ROUTE_PLAIN = 1
ROUTE_KEY_A = 2  # the single key of `gumbel`, key A of `dual_key_gumbel`
ROUTE_KEY_B = 3


@dataclass(frozen=True)
class SampleResult:
    tokens: torch.Tensor
    """int64 [B]"""
    routes: torch.Tensor
    """int8 [B]: ROUTE_* per row."""


@dataclass(frozen=True)
class VerifyResult:
    tokens: torch.Tensor
    """[B, k + 1] int64: the accepted drafts, then the resampled or bonus token; -1 after."""
    num_accepted: torch.Tensor
    """[B] int64 in [0, k]; the row emits num_accepted + 1 tokens."""
    routes: torch.Tensor
    """[B, k + 1] int8 ROUTE_* per emitted token (-1 after)."""
