"""Exact pruning from a row bound (watermark.pruning): the same tokens as the full race."""

from __future__ import annotations

import pytest
import torch

from tests.watermark.kernels import parity
from watermark import gumbel, pruning


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("dist", ["zipf", "normal"])
@pytest.mark.parametrize("chunks", [1, 2, 3, 7, 64])
def test_bounded_race_picks_the_reference_tokens(seed, dist, chunks):
    logits, keys, states = parity.race_case(seed, 12, 3001, torch.float32, "cpu", dist=dist)
    want = gumbel.gumbel_argmax_reference(logits, keys, states)
    got = pruning.bounded_gumbel_argmax(logits, keys, states, chunks=chunks)
    parity.assert_same(f"bounded race (seed {seed}, {chunks} chunks)", got, want)


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("margin", [2e-3, -2e-3])
def test_bounded_race_is_exact_at_the_pruning_edge(margin, chunks):
    # The winner sits NOISE_MAX (the largest noise) below the best other token, 0.002 above
    # or below the bound token's score: a floor 0.004 too high loses it.
    logits, keys, states, reference = parity.bound_edge_case(margin, "cpu")
    got = pruning.bounded_gumbel_argmax(logits, keys, states, chunks=chunks)
    parity.assert_same(f"pruning edge (margin {margin})", got, reference)


def test_infinite_and_empty_rows():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 999, generator=gen)
    logits[0] = float("-inf")  # nothing defined: token 0
    logits[1, 700] = float("inf")
    logits[1, 300] = float("inf")  # the first +inf wins
    logits[2] = float("nan")
    logits[2, 998] = -5.0
    logits[3, :500] = float("-inf")
    keys = parity.random_keys(gen, 4)
    states = torch.randint(0, 2**32, (4, 4), generator=gen, dtype=torch.int64)
    want = gumbel.gumbel_argmax_reference(logits, keys, states)
    assert want[:3].tolist() == [0, 300, 998]
    for chunks in (1, 2, 5):
        got = pruning.bounded_gumbel_argmax(logits, keys, states, chunks=chunks)
        parity.assert_same(f"special rows ({chunks} chunks)", got, want)


def test_floor_prunes_only_what_cannot_win():
    bound = torch.tensor([3.0, float("-inf"), float("inf")])
    floor = pruning.prune_floor(bound)
    assert floor[0] < 3.0 - pruning.NOISE_BOUND
    assert floor[1] == float("-inf")
    assert torch.isnan(floor[2])
    # A logit at the floor plus the largest noise stays strictly below the bound.
    assert float(torch.tensor(floor[0].item(), dtype=torch.float32) + pruning.NOISE_BOUND) < 3.0


def test_zipf_rows_keep_few_candidates():
    # The design's premise on the benchmark's rows (vocabulary 129,280): only a few per
    # cent of a Zipf(2) row can still win under a single chunk bound; every N(0,1) token can.
    gen = torch.Generator().manual_seed(11)
    zipf = parity.zipf_logits(gen, 2, 129_280)
    normal = torch.randn(2, 129_280, generator=gen)
    keys = parity.random_keys(gen, 2)
    states = torch.randint(0, 2**32, (2, 4), generator=gen, dtype=torch.int64)
    assert pruning.candidate_fraction(zipf, keys, states, chunks=2) < 0.08
    assert pruning.candidate_fraction(normal, keys, states, chunks=2) > 0.95
