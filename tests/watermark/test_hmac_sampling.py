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


def _verify_rows(keys: list[RowKeys], contexts, *, keyed_coin: bool, watermark=None):
    from watermark import hmac_rows, speculative
    from watermark.prf import philox_torch

    n, positions = len(keys), len(contexts[0])
    return speculative.VerifyRows(
        key_b=philox_torch.keys_tensor([hmac_rows.narrow_key(k, "key_b") for k in keys], "cpu"),
        key_coin=philox_torch.keys_tensor([hmac_rows.narrow_key(k, "key_coin") for k in keys], "cpu"),
        keyed_coin=torch.tensor([keyed_coin] * n), contexts=contexts,
        watermark=torch.tensor(watermark or [[True] * positions] * n), greedy=torch.zeros(n, dtype=torch.bool),
        stream_keys=torch.tensor([21 + i for i in range(n)]), positions=torch.tensor([5 * i for i in range(n)]),
        wide=hmac_rows.wide_rows(keys))


def test_speculative_verification_of_a_256_bit_dual_key_uses_its_prf():
    """Keyed coins are PRF(key_coin, context_j, 0) and the correction is the ratio race under
    key B's HMAC-derived key and state at its position, as detection recomputes them."""
    from watermark import speculative
    from watermark.gumbel import exponential_race_reference

    dual = WatermarkKey(2**256 - 99, WatermarkSpec(prf="hmac-sha256-philox-v1", algorithm="dual_key_gumbel"))
    keys = [dual.row_keys(), WatermarkKey(5, WatermarkSpec(algorithm="dual_key_gumbel")).row_keys()]
    k, vocab = 3, 600
    gen = torch.Generator().manual_seed(8)
    p = torch.softmax(torch.randn(2, k + 1, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(2, k, vocab, generator=gen) * 2, -1)
    drafts = torch.stack([torch.multinomial(q[:, j], 1, generator=gen).squeeze(-1) for j in range(k)], -1)
    contexts = [speculative.block_contexts((3, 4, 5, 6), d) for d in drafts.tolist()]
    rows = _verify_rows(keys, contexts, keyed_coin=True)
    coins = speculative.coin_values(rows, k)
    impl = hmac_philox.HMAC_PHILOX
    for j in range(k):
        want = impl.uniforms(dual.key_coin, np.array([contexts[0][j]]), np.array([0]))[0]
        assert float(coins[0, j]) == float(want)
    assert torch.equal(coins[1], speculative.coin_values(dataclasses.replace(rows, wide=None), k)[1])
    got = speculative.verify_reference(p, q, drafts, rows, race=exponential_race_reference)
    at = int(got.num_accepted[0])
    assert int(got.routes[0, at]) == ROUTE_KEY_B
    key, state = hmac_philox.context_key_state(dual.key_b, contexts[0][at])
    weights = (p[0, at] - (q[0, at] if at < k else 0)).clamp(min=0)
    weights = weights if float(weights.sum()) > 0 else p[0, at]
    want = exponential_race_reference(weights.unsqueeze(0), torch.tensor([key - 2**64 if key >= 2**63 else key]),
                                      torch.tensor([state], dtype=torch.int64))
    assert int(got.tokens[0, at]) == int(want[0])
    # the 64-bit row is what it is without a 256-bit neighbour
    alone = speculative.verify_reference(p[1:], q[1:], drafts[1:], dataclasses.replace(
        rows, key_b=rows.key_b[1:], key_coin=rows.key_coin[1:], keyed_coin=rows.keyed_coin[1:], contexts=contexts[1:],
        watermark=rows.watermark[1:], greedy=rows.greedy[1:], stream_keys=rows.stream_keys[1:],
        positions=rows.positions[1:], wide=None), race=exponential_race_reference)
    assert torch.equal(alone.tokens[0], got.tokens[1])
