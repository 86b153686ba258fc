"""The compiled CPU race and deduper (numba) against the references, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from watermark import cpu_dedup, cpu_race, gumbel, noise
from watermark.dedup import ContextDeduper

pytestmark = pytest.mark.skipif(not cpu_race.available(), reason="numba is not installed")

SEEDS = (3, 20261202)


def _rows(rng: np.random.Generator, kind: int, batch: int, vocab: int) -> np.ndarray:
    values = (rng.standard_normal((batch, vocab)) * rng.uniform(0.3, 8.0)).astype(np.float32)
    if kind == 1:  # top-k / top-p masks: mostly -inf
        values[:, rng.random(vocab) < 0.95] = -np.inf
    elif kind == 2:  # Zipf(2), ranks permuted
        ranks = np.stack([rng.permutation(vocab) + 1 for _ in range(batch)])
        values = (-2.0 * np.log(ranks) + 0.5 * rng.standard_normal((batch, vocab))).astype(np.float32)
    elif kind == 3:  # many exact ties
        values = np.round(values)
    elif kind == 4 and batch >= 3:  # no finite logit; +inf logits; a single finite logit
        values[0] = -np.inf
        values[1, ::3] = np.inf
        values[2] = -np.inf
        values[2, vocab // 2] = 0.25
    return values


@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_race_matches_the_references(seed):
    rng = np.random.default_rng(seed)
    for trial in range(25):
        batch, vocab = int(rng.integers(1, 9)), int(rng.integers(1, 6000))
        values = _rows(rng, trial % 5, batch, vocab)
        keys = rng.integers(0, 2**63, batch).astype(np.uint64) * np.uint64(2) + np.uint64(trial % 2)
        keys[0] = np.uint64(2**64 - 1)
        states = rng.integers(0, 2**32, (batch, 4)).astype(np.uint64)
        got = cpu_race.race(values, keys, states)
        assert np.array_equal(got, gumbel.race_numpy(values, keys, states, ratio=False)), (seed, trial)
        want = gumbel.gumbel_argmax_reference(torch.from_numpy(values), torch.from_numpy(keys.view(np.int64)),
                                              torch.from_numpy(states.astype(np.int64)))
        assert np.array_equal(got, want.numpy()), (seed, trial)


def test_brackets_hold_every_noise_value():
    table = cpu_race.noise_brackets()
    assert table.shape == (1 << (24 - cpu_race.BUCKET_SHIFT), 2)
    assert (table[:, 0] <= table[:, 1]).all() and (np.diff(table[:, 0]) >= 0).all()
    assert float(table[-1, 1]) == noise.NOISE_MAX and float(table[0, 0]) == noise.NOISE_MIN


@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_deduper_matches_context_deduper(seed):
    rng = np.random.default_rng(seed)
    requests = 9
    dedup = cpu_dedup.CpuDeduper(requests + 2, capacity=200)
    slots = rng.permutation(requests + 2)[:requests]
    refs, seqs = [], []
    for r in range(requests):
        width = [1, 2, 3, 4, 16, int(rng.integers(1, 17))][r % 6]
        scope = ["single_turn", "all", "none"][r % 3]
        window = [None, 1, 3, 8, 40][int(rng.integers(0, 5))]
        prompt = rng.integers(0, 3, int(rng.integers(0, 12))).tolist()
        vocab = [2, 3, 50][r % 3]
        seqs.append(rng.integers(0, vocab, 150).tolist() if r % 4 else [1, 2, 3] * 50)
        refs.append(ContextDeduper(width, scope, window, prompt=prompt))
        dedup.open(int(slots[r]), width=width, scope=scope, max_history=window, prompt=prompt)
    for step in range(150):
        got = dedup.next_repeated(slots)
        assert got.tolist() == [ref.next_repeated() for ref in refs], step
        ctx = dedup.contexts(slots)
        for r, ref in enumerate(refs):
            assert tuple(ctx[r, :ref.width].tolist()) == ref.context, (step, r)
        tokens = np.array([seq[step] for seq in seqs])
        dedup.append(slots, tokens)
        for ref, token in zip(refs, tokens.tolist()):
            ref.push(token)
    assert not dedup.overflow.any()


@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_row_setup_matches_sample_cpu(seed):
    """Routing coin, routed key and context / stream states: the tokens and routes of the
    plain-int setup (sampler._sample_cpu_py, the path without numba)."""
    from watermark import stream
    from watermark.prf import philox_torch as prf
    from watermark.sampler import SamplerRows, _sample_cpu_py, sample_cpu

    rng = np.random.default_rng(seed)
    batch, vocab = 24, 3000
    key_a = rng.integers(0, 2**63, batch).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    key_b = rng.integers(0, 2**63, batch).astype(np.uint64)
    stream_keys = rng.integers(0, 2**63, batch).astype(np.uint64) * np.uint64(2)
    alpha = np.where(rng.random(batch) < 0.5, rng.random(batch), 0.0).astype(np.float32)
    alpha[:3] = 1.0
    widths = 1 + np.arange(batch) % 16
    contexts = rng.integers(-1, 2**31 - 1, (batch, 16))
    watermark = rng.random(batch) < 0.7
    positions = rng.integers(0, 2**40, batch)
    positions[: batch // 2] %= 5000
    values = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
    for lane in (stream.LANE_SAMPLE, stream.LANE_DRAFT):
        keys, states = cpu_race.row_states(key_a, key_b, alpha, stream_keys, contexts, widths, watermark,
                                           positions, lane)
        got = cpu_race.race(values, keys, states)
        rows = SamplerRows(key_a=prf.keys_tensor([int(k) for k in key_a]),
                           key_b=prf.keys_tensor([int(k) for k in key_b]), alpha=torch.from_numpy(alpha),
                           contexts=[contexts[b, :widths[b]].tolist() for b in range(batch)],
                           watermark=torch.from_numpy(watermark), greedy=torch.zeros(batch, dtype=torch.bool),
                           stream_keys=prf.keys_tensor([int(k) for k in stream_keys]),
                           positions=torch.from_numpy(positions))
        want = _sample_cpu_py(torch.from_numpy(values), rows, lane=lane)
        assert got.tolist() == want.tokens.tolist(), lane
        rows = dataclasses.replace(rows, greedy=torch.from_numpy(rng.random(batch) < 0.2))
        want = _sample_cpu_py(torch.from_numpy(values), rows, lane=lane)
        result = sample_cpu(torch.from_numpy(values), rows, lane=lane)
        assert result.tokens.tolist() == want.tokens.tolist(), lane
        assert result.routes.tolist() == want.routes.tolist() and result.routes.dtype == want.routes.dtype, lane
