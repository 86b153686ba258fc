"""GPU parity of the fused Gumbel kernels with the torch references (bit-exact token ids)."""

from __future__ import annotations

import pytest
import torch

from tests.watermark.kernels import parity

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Odd batches; vocabularies that are not multiples of the 2048-token tile, one that is,
# and the benchmark's 129,280.
SHAPES = [(1, 4099), (5, 129_280), (37, 50_257), (64, 3 * 2048), (9, 7)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch,vocab", SHAPES)
def test_gumbel_sample_matches_sampler(seed, cuda, dtype, batch, vocab):
    parity.check_gumbel_sample(seed, batch, vocab, dtype, cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["pad", "offset", "columns"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gumbel_sample_non_contiguous_rows(seed, cuda, dtype, layout):
    parity.check_gumbel_sample(seed, 23, 30_011, dtype, cuda, layout=layout)


@pytest.mark.gpu
def test_gumbel_sample_draft_lane(seed, cuda):
    """Unwatermarked speculative drafts draw from their own stream lane (LANE_DRAFT)."""
    from watermark import stream

    parity.check_gumbel_sample(seed, 31, 20_000, torch.bfloat16, cuda, lane=stream.LANE_DRAFT)


@pytest.mark.gpu
@pytest.mark.parametrize("blocks_per_row", [1, 2, 7, 64])
def test_gumbel_sample_any_split_of_the_row(seed, cuda, blocks_per_row):
    """The in-kernel cross-block reduction gives the same tokens however rows are split."""
    parity.check_gumbel_sample(seed, 11, 129_280, torch.float32, cuda, blocks_per_row=blocks_per_row)


@pytest.mark.gpu
def test_gumbel_sample_repeated_launches_reuse_the_workspace(seed, cuda):
    """Counters reset by the last program: back-to-back launches of changing shapes agree."""
    for i, (batch, vocab) in enumerate([(3, 9000), (40, 9000), (2, 129_280), (40, 3000)]):
        parity.check_gumbel_sample(seed + i, batch, vocab, torch.bfloat16, cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch,vocab", SHAPES)
def test_gumbel_argmax_matches_reference(seed, cuda, dtype, batch, vocab):
    parity.check_gumbel_argmax(seed, batch, vocab, dtype, cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["pad", "offset", "columns"])
def test_gumbel_argmax_non_contiguous_rows(seed, cuda, layout):
    parity.check_gumbel_argmax(seed, 13, 20_001, torch.float32, cuda, layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch,vocab", SHAPES)
def test_exponential_race_matches_reference(seed, cuda, dtype, batch, vocab):
    parity.check_exponential_race(seed, batch, vocab, dtype, cuda)


@pytest.mark.gpu
def test_dispatch_from_watermark_gumbel_uses_the_kernel(seed, cuda):
    """watermark.gumbel.gumbel_argmax on CUDA dispatches here and agrees with the reference."""
    from watermark import dispatch, gumbel

    logits, keys, states = parity.race_case(seed, 6, 10_000, torch.float32, cuda)
    assert torch.equal(dispatch.gumbel_argmax(logits, keys, states), gumbel.gumbel_argmax_reference(logits, keys, states))


@pytest.mark.gpu
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gumbel_sample_zipf_rows(seed, cuda, dtype, compact):
    """Zipf(2) rows: most tiles turn sparse (only tokens that can still win are raced)."""
    parity.check_gumbel_sample(seed, 19, 129_280, dtype, cuda, dist="zipf", compact=compact)


@pytest.mark.gpu
@pytest.mark.parametrize("compact", [True, False])
def test_pruning_is_exact_at_its_edge(cuda, compact):
    """A token NOISE_MAX below the best logit still wins when its noise says so."""
    parity.check_pruning_edge(cuda, compact=compact)


@pytest.mark.gpu
def test_small_tiles_gather_several_rounds(seed, cuda):
    """512-token tiles: sparse tiles gather their live tokens in several rounds."""
    parity.check_gumbel_sample(seed, 7, 60_000, torch.float32, cuda, dist="zipf", block=512)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [512, 2048])
def test_queue_keeps_the_first_index_on_ties(seed, cuda, block):
    """Tokens queued by a sparse tile are raced after a later dense tile: exact ties between
    them still go to the lower token (lexicographic merge)."""
    parity.check_queue_order(seed, cuda, block=block)
