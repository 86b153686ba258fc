"""GPU parity of the bounded sampler (watermark.kernels.bounded) with the torch reference."""

from __future__ import annotations

import pytest
import torch

from tests.watermark.kernels import parity


@pytest.mark.gpu
@pytest.mark.parametrize("dist", ["zipf", "normal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("batch,vocab", [(256, 129_280), (37, 50_257), (300, 4099), (1, 7)])
def test_bounded_sample_matches_sampler(seed, cuda, dist, dtype, batch, vocab):
    parity.check_bounded_sample(seed, batch, vocab, dtype, cuda, dist=dist)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["pad", "offset", "columns"])
def test_bounded_sample_non_contiguous_rows(seed, cuda, layout):
    parity.check_bounded_sample(seed, 64, 20_000, torch.float32, cuda, dist="zipf", layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("rows_in_flight,block", [(1, 2048), (16, 2048), (64, 1024), (7, 512)])
def test_bounded_sample_any_grid(seed, cuda, rows_in_flight, block):
    parity.check_bounded_sample(seed, 129, 129_280, torch.float32, cuda, dist="zipf", block=block,
                                rows_in_flight=rows_in_flight)


@pytest.mark.gpu
def test_bounded_sample_draft_lane(seed, cuda):
    parity.check_bounded_sample(seed, 40, 9000, torch.float32, cuda, dist="zipf", lane=3)


@pytest.mark.gpu
@pytest.mark.parametrize("rows_in_flight,block", [(1, 2048), (2, 512)])
def test_bounded_sample_is_exact_at_the_pruning_edge(cuda, rows_in_flight, block):
    parity.check_bounded_edge(cuda, block=block, rows_in_flight=rows_in_flight)


@pytest.mark.gpu
@pytest.mark.parametrize("dist", ["zipf", "normal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("batch,vocab", [(256, 129_280), (37, 50_257), (300, 4099), (1, 7)])
def test_seeded_sample_matches_sampler(seed, cuda, dist, dtype, batch, vocab):
    parity.check_seeded_sample(seed, batch, vocab, dtype, cuda, dist=dist)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["pad", "offset", "columns"])
@pytest.mark.parametrize("compact", [True, False])
def test_seeded_sample_layouts_and_dense(seed, cuda, layout, compact):
    parity.check_seeded_sample(seed, 64, 20_000, torch.float32, cuda, dist="zipf", layout=layout, compact=compact)


@pytest.mark.gpu
def test_seeded_sample_is_exact_at_the_pruning_edge(cuda):
    parity.check_bounded_edge(cuda, block=2048, seeded=True)
