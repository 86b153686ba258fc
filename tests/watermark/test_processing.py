import pytest
import torch

from watermark.processing import ProcessingParams, process_logits, validate_sampling


def test_temperature_scales_and_greedy_rows_stay_unscaled():
    logits = torch.tensor([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])
    params = ProcessingParams(torch.tensor([2.0, 0.0]), torch.tensor([0, 0]), torch.tensor([1.0, 1.0]))
    out = process_logits(logits, params)
    assert torch.allclose(out[0], logits[0] / 2) and torch.equal(out[1], logits[1])


def test_top_k_keeps_ties_together():
    logits = torch.tensor([[5.0, 3.0, 3.0, 1.0, 0.0]])
    out = process_logits(logits, ProcessingParams(torch.tensor([1.0]), torch.tensor([2]), torch.tensor([1.0])))
    assert torch.isfinite(out[0]).tolist() == [True, True, True, False, False]


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = process_logits(probs.log(), ProcessingParams(torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.79])))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    out = process_logits(probs.log(), ProcessingParams(torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0.81])))
    assert torch.isfinite(out[0]).tolist() == [True, True, True, False]


def test_nan_becomes_neg_inf():
    out = process_logits(torch.tensor([[float("nan"), 1.0]]), ProcessingParams.uniform(1))
    assert out[0, 0].item() == float("-inf")


@pytest.mark.parametrize("t,k,p", [(-1, 0, 1.0), (float("nan"), 0, 1.0), (1.0, -1, 1.0), (1.0, 0, 0.0), (1.0, 0, 1.5)])
def test_invalid_sampling_parameters(t, k, p):
    with pytest.raises(ValueError):
        validate_sampling(t, k, p)
