"""Sampling under 256-bit keys (hmac-sha256-philox-v1): every CPU path picks the tokens of the
Gumbel-max race over the PRF's uniforms, batches mix 64- and 256-bit rows, and the text is
detected under its key only."""

import dataclasses

import numpy as np
import pytest
import torch

from detector.detect import DetectorConfig, detect
from detector.multikey import detect_many
from detector.result import Candidate, salted_candidates
from tests.synthetic import generate, human_like
from watermark import dispatch, sampler, stream
from watermark.key import RowKeys, WatermarkKey, row_keys
from watermark.noise import noise_from_uniforms_numpy
from watermark.prf import hmac_philox, philox
from watermark.results import ROUTE_KEY_B
from watermark.spec import WatermarkSpec

WIDE = WatermarkSpec(prf="hmac-sha256-philox-v1")
KEY = 2**255 + 0xC0FFEE


def _expected(logits: np.ndarray, key: int, context) -> int:
    vocab = logits.shape[-1]
    words = hmac_philox.words_reference(key, np.array([list(context)] * vocab), np.arange(vocab))
    return int(np.argmax(logits + noise_from_uniforms_numpy(philox.uniforms_from_words_numpy(words))))


def _rows(keys, contexts, watermark=None):
    n = len(keys)
    return sampler.sampler_rows(keys, contexts=contexts, watermark=watermark or [True] * n, greedy=[False] * n,
                                stream_keys=[11 + i for i in range(n)], positions=list(range(n)))


def test_mixed_batch_every_cpu_path_equals_the_race():
    wide_dual = WatermarkKey(2**256 - 7, WatermarkSpec(prf="hmac-sha256-philox-v1", algorithm="dual_key_gumbel",
                                                       alpha=0.5))
    keys = [WatermarkKey(KEY, WIDE).row_keys(), WatermarkKey(5, WatermarkSpec()).row_keys(), wide_dual.row_keys(),
            wide_dual.row_keys()]
    contexts = [(1, 2, 3, 4), (9, 9), (-1,), (7, 8, 9, 10, 11, 12, 13, 14, 15)]
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(1)) * 2
    rows = _rows(keys, contexts)
    assert rows.wide is not None and rows.wide.wide.tolist() == [True, False, True, True]
    reference = sampler.sample_reference(logits, rows)
    fast = sampler.sample_cpu(logits, rows)
    plain = sampler._sample_cpu_py(logits, rows, stream.LANE_SAMPLE)
    for result in (fast, plain):
        assert torch.equal(result.tokens, reference.tokens) and torch.equal(result.routes, reference.routes)
    assert int(reference.tokens[0]) == _expected(logits[0].numpy(), KEY, contexts[0])
    routed = [wide_dual.key_b if r == ROUTE_KEY_B else wide_dual.key_a for r in reference.routes[2:].tolist()]
    for row, key in zip((2, 3), routed):
        assert int(reference.tokens[row]) == _expected(logits[row].numpy(), key, contexts[row])
    # a 64-bit row is unchanged by its 256-bit neighbours
    alone = sampler.sample_reference(logits[1:2], _rows(keys[1:2], contexts[1:2]))
    assert int(alone.tokens[0]) == int(reference.tokens[1])


def test_unwatermarked_wide_rows_use_the_ordinary_stream():
    keys = [WatermarkKey(KEY, WIDE).row_keys()] * 2
    logits = torch.randn(2, 500, generator=torch.Generator().manual_seed(2))
    wide = _rows(keys, [(1,), (2,)], watermark=[False, False])
    narrow = dataclasses.replace(wide, wide=None)
    assert torch.equal(sampler.sample_cpu(logits, wide).tokens, sampler.sample_cpu(logits, narrow).tokens)


def test_sample_padded_cpu_table_equals_reference():
    keys = [WatermarkKey(KEY, WIDE).row_keys(), WatermarkKey(KEY + 1, WIDE).row_keys()]
    contexts = torch.tensor([[5, 6, 7, 0], [1, 2, 3, 4]])
    widths = torch.tensor([3, 4], dtype=torch.int32)
    logits = torch.randn(2, 800, generator=torch.Generator().manual_seed(3))
    rows = _rows(keys, [(5, 6, 7), (1, 2, 3, 4)])
    padded = dispatch.sample_padded(logits, dataclasses.replace(rows, contexts=()), contexts, widths)
    assert torch.equal(padded.tokens, sampler.sample_reference(logits, rows).tokens)


def test_vllm_hmac_keys_detect_but_do_not_generate():
    key = WatermarkKey(KEY, WatermarkSpec(prf="hmac_sha256"))
    with pytest.raises(ValueError, match="not supported"):
        _rows([key.row_keys()], [(1,)])


@pytest.mark.parametrize("spec_kwargs", [{}, {"algorithm": "dual_key_gumbel"}, {"mode": "diverse"},
                                         {"context_width": 9}])
def test_text_under_a_256_bit_key_is_detected_under_it_only(spec_kwargs):
    key = WatermarkKey(KEY, WatermarkSpec(prf="hmac-sha256-philox-v1", **spec_kwargs))
    if key.spec.mode == "diverse":
        key = key.with_salt(3)
    tokens, _ = generate(key, 120, scale=2.0, seed=4)
    config = DetectorConfig(spans=False)
    unsalted = dataclasses.replace(key, salt=None)
    candidates = salted_candidates([Candidate.inline(unsalted)])  # a diverse key: its 16 salts
    result = detect(tokens, candidates, config)
    assert result.watermarked and result.log10_p_value < -8
    assert detect_many(tokens, candidates, config).log10_p_value == result.log10_p_value
    # the same secret as a Philox key (its low 64 bits) or another 256-bit key: nothing
    for other in (WatermarkKey(KEY & (2**64 - 1), WatermarkSpec(**spec_kwargs)),
                  WatermarkKey(KEY ^ 1, unsalted.spec)):
        assert not detect(tokens, salted_candidates([Candidate.inline(other)]), config).watermarked
    assert not detect(human_like(150, seed=5), candidates, config).watermarked


def test_row_keys_carry_the_prf():
    key = WatermarkKey(KEY, WIDE)
    assert row_keys(key) == RowKeys(key_a=key.prf_secret, key_b=key.prf_secret, key_coin=0, alpha=0.0,
                                    prf="hmac-sha256-philox-v1")
    assert key.prf_secret == KEY
    dual = WatermarkKey(KEY, WatermarkSpec(prf="hmac-sha256-philox-v1", algorithm="dual_key_gumbel"))
    assert max(dual.key_a, dual.key_b, dual.key_coin).bit_length() > 64  # sub-keys stay 256-bit
