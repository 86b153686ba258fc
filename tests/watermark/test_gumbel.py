import math

import numpy as np
import pytest
import torch

from watermark import gumbel
from watermark import noise as gumbel_noise
from watermark.prf import philox_torch


def _random_case(seed: int, batch: int, vocab: int, scale: float):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen) * scale
    keys = torch.randint(-2**63, 2**63 - 1, (batch,), generator=gen)
    widths = [1 + (i * 5) % 16 for i in range(batch)]
    contexts = [tuple(torch.randint(-1, 200_000, (w,), generator=gen).tolist()) for w in widths]
    return logits, keys, philox_torch.context_states_torch(keys, contexts)


@pytest.mark.parametrize("seed,batch,vocab,scale", [
    (0, 1, 7, 1.0), (1, 5, 1001, 0.5), (2, 9, 4099, 3.0), (3, 3, 50_257, 8.0), (4, 17, 129, 30.0),
])
def test_cpu_pruned_path_matches_reference(seed, batch, vocab, scale):
    logits, keys, states = _random_case(seed, batch, vocab, scale)
    assert torch.equal(gumbel.gumbel_argmax_cpu(logits, keys, states),
                       gumbel.gumbel_argmax_reference(logits, keys, states))


def test_nan_and_neg_inf_entries():
    logits, keys, states = _random_case(5, 6, 300, 2.0)
    logits[0, ::2] = float("-inf")
    logits[1, :] = float("nan")
    logits[1, 17] = 0.0
    logits[2, :] = float("-inf")
    logits[3, 5] = float("nan")
    ref = gumbel.gumbel_argmax_reference(logits, keys, states)
    assert torch.equal(gumbel.gumbel_argmax_cpu(logits, keys, states), ref)
    assert ref[1].item() == 17  # the only defined logit
    assert ref[2].item() == 0  # no finite logit: token 0 by definition
    assert ref[3].item() != 5
    assert ref[0].item() % 2 == 1


def test_non_contiguous_rows():
    logits, keys, states = _random_case(6, 4, 1000, 2.0)
    wide = torch.randn(4, 2000)
    wide[:, ::2] = logits
    view = wide[:, ::2]
    assert not view.is_contiguous()
    assert torch.equal(gumbel.gumbel_argmax_cpu(view, keys, states), gumbel.gumbel_argmax_reference(logits, keys, states))


def test_exponential_race_matches_reference():
    logits, keys, states = _random_case(8, 6, 3001, 2.0)
    weights = torch.softmax(logits, -1)
    weights[0, :1500] = 0
    weights[1] = 0
    ref = gumbel.exponential_race_reference(weights, keys, states)
    assert torch.equal(gumbel.exponential_race_cpu(weights, keys, states), ref)
    assert ref[0].item() >= 1500 and ref[1].item() == 0


def test_noise_bounds_are_the_grid_extremes():
    u = torch.tensor([1.0 / (2**24 + 1), 2.0**24 / (2**24 + 1)], dtype=torch.float64).to(torch.float32)
    noise = gumbel_noise.noise_from_uniforms(u)
    assert noise[0].item() == gumbel_noise.NOISE_MIN and noise[1].item() == gumbel_noise.NOISE_MAX
    assert math.isclose(gumbel_noise.NOISE_MAX, 16.6355, abs_tol=1e-3)


def test_argmax_equals_gumbel_formula_on_golden_uniforms(philox_golden):
    case = philox_golden["cases"][2]
    key, tokens = int(case["key"]), case["tokens"]
    vocab = max(tokens) + 1
    logits = torch.full((1, vocab), float("-inf"))
    logits[0, tokens] = 0.0
    keys = philox_torch.keys_tensor([key])
    states = philox_torch.context_states_torch(keys, [tuple(case["context"])])
    u = np.array(case["uniforms"], dtype=np.float64)
    expected = tokens[int(np.argmax(-np.log(-np.log(u))))]
    assert gumbel.gumbel_argmax_reference(logits, keys, states).item() == expected
    assert gumbel.gumbel_argmax_cpu(logits, keys, states).item() == expected
