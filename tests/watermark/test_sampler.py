"""The batched sampler: exact output distribution (chi-square), per-row keys, routing."""

import numpy as np
import pytest
import torch

from tests.stats_helpers import binomial_two_sided_p, chi_square_p
from watermark import dispatch, prf, results, sampler, stream
from watermark.prf import philox, philox_torch
from watermark.key import UNKEYED, RowKeys, WatermarkKey, row_keys
from watermark.processing import ProcessingParams, process_logits
from watermark.spec import WatermarkSpec

TARGET_LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
N = 40_000


def _rows(n: int, seed: int, *, alpha: float = 0.0, watermark: bool | torch.Tensor = True,
          width: int = 4) -> sampler.SamplerRows:
    """n rows with random keys, contexts and positions."""
    gen = torch.Generator().manual_seed(seed)
    rand_keys = lambda: torch.randint(-2**63, 2**63 - 1, (n,), generator=gen)  # noqa: E731
    contexts = torch.randint(-1, 50_000, (n, width), generator=gen).tolist()
    wm = torch.full((n,), watermark) if isinstance(watermark, bool) else watermark
    return sampler.SamplerRows(
        key_a=rand_keys(), key_b=rand_keys(), alpha=torch.full((n,), alpha), contexts=contexts,
        watermark=wm, greedy=torch.zeros(n, dtype=torch.bool), stream_keys=rand_keys(),
        positions=torch.randint(0, 10_000, (n,), generator=gen),
    )


def _counts(tokens: torch.Tensor, vocab: int) -> np.ndarray:
    return np.bincount(tokens.numpy(), minlength=vocab)


def _target(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.to(torch.float64), -1).numpy()


@pytest.mark.statistical
@pytest.mark.parametrize("case", ["single", "dual", "plain", "mixed"])
def test_output_distribution_is_exact(case):
    alpha = 0.3 if case in ("dual", "mixed") else 0.0
    watermark = True
    if case == "plain":
        watermark = False
    elif case == "mixed":
        watermark = torch.arange(N) % 3 != 0
    rows = _rows(N, seed=11, alpha=alpha, watermark=watermark)
    logits = TARGET_LOGITS.expand(N, -1).clone()
    result = dispatch.sample(logits, rows)
    assert chi_square_p(_counts(result.tokens, 8), _target(TARGET_LOGITS)) > 1e-3


@pytest.mark.statistical
def test_chi_square_has_power_against_a_two_percent_bias():
    rows = _rows(N, seed=12)
    result = dispatch.sample(TARGET_LOGITS.expand(N, -1).clone(), rows)
    biased = _target(TARGET_LOGITS).copy()
    biased[0] -= 0.02
    biased[4] += 0.02  # total variation 0.02
    assert chi_square_p(_counts(result.tokens, 8), biased) < 1e-6


@pytest.mark.statistical
def test_processed_distribution_with_top_k_top_p_and_temperature():
    params = ProcessingParams.uniform(N, temperature=0.7, top_k=6, top_p=0.9)
    logits = process_logits(TARGET_LOGITS.expand(N, -1).clone(), params)
    result = dispatch.sample(logits, _rows(N, seed=13))
    target = _target(logits[0])
    assert (target[np.isneginf(logits[0].numpy())] == 0).all()
    assert chi_square_p(_counts(result.tokens, 8), target) > 1e-3


@pytest.mark.statistical
def test_dual_key_routing_share_is_alpha():
    rows = _rows(N, seed=14, alpha=0.1)
    result = dispatch.sample(TARGET_LOGITS.expand(N, -1).clone(), rows)
    used_b = int((result.routes == results.ROUTE_KEY_B).sum())
    assert binomial_two_sided_p(used_b, N, 0.1) > 1e-3


def test_per_row_keys_in_one_batch_equal_separate_calls():
    rows = _rows(12, seed=15, alpha=0.5, watermark=torch.arange(12) % 4 != 0)
    logits = torch.randn(12, 300, generator=torch.Generator().manual_seed(1))
    batched = dispatch.sample(logits, rows)
    for i in range(12):
        one = sampler.SamplerRows(
            key_a=rows.key_a[i:i + 1], key_b=rows.key_b[i:i + 1], alpha=rows.alpha[i:i + 1],
            contexts=[rows.contexts[i]], watermark=rows.watermark[i:i + 1], greedy=rows.greedy[i:i + 1],
            stream_keys=rows.stream_keys[i:i + 1], positions=rows.positions[i:i + 1])
        single = dispatch.sample(logits[i:i + 1], one)
        assert single.tokens.item() == batched.tokens[i].item()
        assert single.routes.item() == batched.routes[i].item()


def test_watermarked_token_is_the_keyed_gumbel_argmax():
    key = WatermarkKey(2**63 + 12345, WatermarkSpec())
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(3))
    context = (5, 6, 7, 8)
    rows = sampler.sampler_rows([key.row_keys()], contexts=[context], watermark=[True], greedy=[False],
                                stream_keys=[stream.stream_key(1)], positions=[0])
    token = dispatch.sample(logits, rows).tokens.item()
    u = philox.words_numpy(key.secret, np.array([context] * 1000), np.arange(1000))
    u = philox.uniforms_from_words_numpy(u).astype(np.float64)
    assert token == int(np.argmax(logits[0].numpy() + (-np.log(-np.log(u))).astype(np.float32)))
    assert dispatch.sample(logits, rows).routes.item() == results.ROUTE_KEY_A


def test_greedy_rows_take_the_argmax_unwatermarked():
    rows = _rows(4, seed=16)
    rows = sampler.SamplerRows(**{**rows.__dict__, "greedy": torch.tensor([True, False, True, False])})
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(4))
    result = dispatch.sample(logits, rows)
    assert result.tokens[0] == logits[0].argmax() and result.tokens[2] == logits[2].argmax()
    assert result.routes[0] == results.ROUTE_GREEDY and result.routes[1] == results.ROUTE_KEY_A


def test_stream_is_reproducible_for_a_seed_and_differs_across_seeds():
    assert stream.stream_key(5) == stream.stream_key(5) != stream.stream_key(6)
    with pytest.raises(ValueError):
        stream.stream_key(-1)


@pytest.mark.parametrize("seed", range(6))
def test_cpu_path_equals_torch_reference(seed):
    n = 33
    gen = torch.Generator().manual_seed(100 + seed)
    rows = _rows(n, seed=200 + seed, alpha=[0.0, 0.1, 0.5, 1.0][seed % 4],
                 watermark=torch.rand(n, generator=gen) < 0.7, width=1 + seed * 3)
    rows = sampler.SamplerRows(**{**rows.__dict__, "greedy": torch.rand(n, generator=gen) < 0.15})
    logits = torch.randn(n, 3001, generator=gen) * (1 + seed)
    logits[0, :] = float("-inf")
    logits[1, 7] = float("nan")
    for lane in (stream.LANE_SAMPLE, stream.LANE_DRAFT):
        fast = sampler.sample_cpu(logits, rows, lane)
        reference = sampler.sample_reference(logits, rows, lane=lane)
        assert torch.equal(fast.tokens, reference.tokens)
        assert torch.equal(fast.routes, reference.routes)


def test_row_keys_single_dual_and_unkeyed():
    """The one key A / key B / alpha derivation every engine uses (watermark.key.row_keys):
    a single-key key is its own key A and key B with alpha 0 (vLLM's `gumbel` has one PRF
    keyed by the secret); a dual-key key uses derive(secret, "key_a"/"key_b") and its alpha."""
    single = WatermarkKey(2**63 + 12345, WatermarkSpec())
    dual = WatermarkKey(2**40 + 7, WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.25))
    assert row_keys(single) == RowKeys(key_a=single.secret, key_b=single.secret, key_coin=0, alpha=0.0)
    assert row_keys(dual) == RowKeys(key_a=prf.derive_key(dual.secret, "key_a"),
                                     key_b=prf.derive_key(dual.secret, "key_b"),
                                     key_coin=dual.key_coin, alpha=0.25)
    assert row_keys(None) == UNKEYED
    rows = sampler.sampler_rows([row_keys(single), row_keys(dual), row_keys(dual)], contexts=[(), (1,), (2,)],
                                watermark=[True, True, False], greedy=[False, False, True],
                                stream_keys=[2**64 - 1, 0, 5], positions=[0, 1, 2], routed=False)
    assert rows.key_a.tolist() == philox_torch.keys_tensor([single.secret, dual.key_a, dual.key_a]).tolist()
    assert rows.key_b.tolist() == philox_torch.keys_tensor([single.secret, dual.key_b, dual.key_b]).tolist()
    assert rows.alpha.tolist() == [0.0, 0.0, 0.0]  # not routed: speculative drafts use key A
    assert rows.stream_keys.tolist() == [-1, 0, 5]
    assert rows.watermark.tolist() == [True, True, False] and rows.greedy.tolist() == [False, False, True]
    routed = sampler.sampler_rows([row_keys(dual)], contexts=[()], watermark=[True], greedy=[False],
                                  stream_keys=[0], positions=[0])
    assert routed.alpha.tolist() == [0.25]
