"""Logit processing before the watermark draws: temperature, top-k, top-p.

The watermark acts on the *final* distribution, so every filter runs first. Top-k and
top-p are applied as per-row thresholds (keep logits >= the row's cut-off), which keeps
tied tokens together and makes the result independent of sort stability. NaN logits are
treated as -inf: a token with no defined probability is never drawn.

Temperatures are 0 (greedy) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]. Below about 1e-2 the
division overflows float32 (a logit of 40 at T = 1e-38 is inf, and inf - inf is NaN), and
below float32's smallest subnormal the temperature itself rounds to 0, which would make a
sampled row look greedy to one layer and not to another. vLLM clamps to the same 1e-2.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from watermark.transfer import to_device

MIN_TEMPERATURE = 0.01
"""The smallest non-zero temperature (vLLM's ``_MAX_TEMP`` clamp is the same 1e-2)."""

MAX_TEMPERATURE = 100.0
"""The largest temperature: far above any useful value, still exact in float32."""


@dataclass(frozen=True)
class ProcessingParams:
    """Per-row sampling parameters, tensors [B].

    temperature: 0 marks a greedy (unwatermarked) row; top_k: 0 disables; top_p: 1 disables.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor

    @classmethod
    def uniform(cls, batch: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                device: torch.device | str = "cpu") -> "ProcessingParams":
        return cls(
            temperature=torch.full((batch,), temperature, dtype=torch.float32, device=device),
            top_k=torch.full((batch,), top_k, dtype=torch.int64, device=device),
            top_p=torch.full((batch,), top_p, dtype=torch.float32, device=device),
        )

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0

    @functools.cached_property
    def divisor(self) -> torch.Tensor:
        """What each row's logits are divided by [B] (float32, on the temperature's device):
        the temperature, raised to MIN_TEMPERATURE, and 1 for greedy rows. Computed once per
        params object, so an engine that keeps one per batch pays for it once."""
        temperature = self.temperature.to(torch.float32)
        return torch.where(temperature == 0, torch.ones_like(temperature), temperature.clamp(min=MIN_TEMPERATURE))

    @functools.cached_property
    def top_k_values(self) -> frozenset[int]:
        """The rows' distinct top-k values (host ints, read once per params object)."""
        return frozenset(self.top_k.tolist())

    @functools.cached_property
    def uses_top_p(self) -> bool:
        """Whether any row filters by top-p (read once per params object)."""
        return bool((self.top_p < 1.0).any())


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ValueError with a message a client can act on."""
    if not (temperature == 0.0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}; "
                         f"smaller non-zero values overflow the sampler's float32 arithmetic")
    if top_k < 0:
        raise ValueError("top_k must be >= 0 (0 disables it)")
    if not (0.0 < top_p <= 1.0):
        raise ValueError("top_p must be in (0, 1] (1 disables it)")


def process_logits(logits: torch.Tensor, params: ProcessingParams) -> torch.Tensor:
    """Logits [B, V] give float32 processed logits [B, V], filtered tokens at -inf.

    Greedy rows are returned unscaled (only their argmax is used). A non-zero temperature
    below MIN_TEMPERATURE (callers validate with :func:`validate_sampling`) is raised to it
    here, so that no row ever divides by a subnormal or overflows to inf - inf = NaN.
    """
    inf = float("inf")
    out = torch.nan_to_num(logits.to(torch.float32), nan=-inf, posinf=inf, neginf=-inf)
    # Row parameters may come from the host: their checks below then read no device memory.
    out = out / to_device(params.divisor, out.device).unsqueeze(-1)
    vocab = out.shape[-1]
    if any(0 < k < vocab for k in params.top_k_values):
        top_k = to_device(params.top_k, out.device)
        k = top_k.clamp(min=1, max=vocab)
        sorted_desc = torch.sort(out, dim=-1, descending=True).values
        kth = sorted_desc.gather(-1, (k - 1).unsqueeze(-1))
        active = ((top_k > 0) & (top_k < vocab)).unsqueeze(-1)
        out = torch.where(active & (out < kth), torch.full_like(out, float("-inf")), out)
    if params.uses_top_p:
        top_p = to_device(params.top_p, out.device).to(torch.float32)
        sorted_desc = torch.sort(out, dim=-1, descending=True).values
        probs = torch.softmax(sorted_desc.to(torch.float64), dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        keep = mass_before < top_p.to(torch.float64).unsqueeze(-1)
        keep[:, 0] = True
        # The cut-off is the smallest kept logit; ties with it stay in.
        last_kept = keep.sum(dim=-1, keepdim=True) - 1
        cutoff = sorted_desc.gather(-1, last_kept)
        active = (top_p < 1.0).unsqueeze(-1)
        out = torch.where(active & (out < cutoff), torch.full_like(out, float("-inf")), out)
    return out
