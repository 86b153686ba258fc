"""Bound launches (watermark.kernels.launch.Prepared): the vLLM plugin's CUDA step launches
the sampler and the deduper's step through them; same results as the ordinary launchers."""

from __future__ import annotations

import pytest
import torch

from tests.watermark.kernels import parity


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prepared_sample_matches_gumbel_sample(seed, cuda, dtype):
    assert parity.check_prepared_sample(seed, 37, 129_280 if dtype == torch.float32 else 5003, dtype, cuda)


@pytest.mark.gpu
def test_prepared_dedup_step_matches_step(seed, cuda):
    assert parity.check_prepared_dedup_step(seed, cuda)
