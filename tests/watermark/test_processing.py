import pytest
import torch

from watermark.processing import MAX_TEMPERATURE, MIN_TEMPERATURE, ProcessingParams, process_logits, validate_sampling


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


@pytest.mark.parametrize("t", [1e-50, 1e-40, 1e-38, 1e-36, 0.009, 100.5, float("inf")])
def test_tiny_and_huge_temperatures_are_refused(t):
    with pytest.raises(ValueError, match="temperature"):
        validate_sampling(t, 0, 1.0)


@pytest.mark.parametrize("t", [0.0, MIN_TEMPERATURE, 1.0, MAX_TEMPERATURE])
def test_documented_temperatures_are_accepted(t):
    validate_sampling(t, 0, 1.0)


@pytest.mark.parametrize("t", [1e-40, 1e-38, 1e-20])
def test_a_tiny_temperature_that_slips_through_is_clamped_never_nan(t):
    # Unvalidated callers: the row behaves as at MIN_TEMPERATURE (sharp, finite), never T = 1 or NaN.
    logits = torch.tensor([[40.0, 39.0, -3.0]])
    out = process_logits(logits, ProcessingParams(torch.tensor([t]), torch.tensor([0]), torch.tensor([1.0])))
    clamped = process_logits(logits, ProcessingParams.uniform(1, temperature=MIN_TEMPERATURE))
    assert not torch.isnan(out).any() and torch.equal(out, clamped)
