"""GPU parity of fused speculative verification with watermark.speculative.verify_reference."""

from __future__ import annotations

import pytest
import torch

from tests.watermark.kernels import parity


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("batch,k,vocab", [(64, 4, 129_280), (7, 1, 4099), (33, 3, 50_257), (5, 6, 2048)])
def test_verify_matches_reference(seed, cuda, dtype, batch, k, vocab):
    parity.check_verify(seed, batch, k, vocab, dtype, cuda)


@pytest.mark.gpu
def test_verify_covers_early_rejection_full_acceptance_and_empty_residuals(seed, cuda):
    totals = {}
    for i in range(4):
        for name, count in parity.check_verify(seed + i, 50, 4, 3001, torch.float32, cuda).items():
            totals[name] = totals.get(name, 0) + count
    assert all(totals[name] > 0 for name in ("early_rejection", "full_acceptance", "empty_residual", "greedy")), totals


@pytest.mark.gpu
@pytest.mark.parametrize("blocks_per_row", [1, 3, 64])
def test_verify_any_split_of_the_row(seed, cuda, blocks_per_row):
    parity.check_verify(seed, 12, 3, 129_280, torch.float32, cuda, blocks_per_row=blocks_per_row)
