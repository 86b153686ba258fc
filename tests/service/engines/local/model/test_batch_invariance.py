"""On CUDA in bfloat16, one row's logits from the static-cache step (static_runner._step,
what the CUDA graphs replay) are bit-for-bit the same whatever batch bucket it runs in,
whichever slot it holds, whatever column window the step reads, and whether its inputs
come one, two (left-padded, as the draft's) or five (a verify step) at a time: the
guarantee that a request's text does not depend on its batch, at the level of the forward.
The cache holds random values (the same for the row in every case); the other rows are
random. ``test_each_linear_is_row_invariant`` reports which matrix product, if any, is not."""

from __future__ import annotations

import pytest
import torch

from tests.service.engine_models import TEST_DRAFT, TEST_MODEL

COLUMNS = 1100
HISTORY = 100  # the row's live columns before the step: every window (128 ... 1,024) holds them


def _setup(name):
    from service.engines.local.model import StaticCache
    from service.engines.local.runner import load_model
    from service.model_paths import resolve_model_path

    cuda = torch.device("cuda")
    model = load_model(resolve_model_path(name), cuda)
    gen = torch.Generator(device=cuda).manual_seed(0)
    base = StaticCache.for_model(model, 64, COLUMNS, cuda, torch.bfloat16)
    for layer in base.layers:
        for tensor in layer.values():
            tensor.copy_(torch.randn(tensor.shape, generator=gen, device=cuda))
    row = [{name: torch.randn(t.shape[1:], generator=gen, device=cuda).to(t.dtype) for name, t in layer.items()}
           for layer in base.layers]
    return model, base, row, gen


def _logits(model, base, row, gen, batch, slot, window, inputs, live):
    """The row's logits [S, V] at ``slot`` of a ``batch``-row step over ``window`` columns."""
    from service.engines.local.model import StaticCache
    from service.engines.local.static_runner import _step

    cuda = torch.device("cuda")
    cache = StaticCache([{n: t.clone() for n, t in layer.items()} for layer in base.layers], base.slots, base.columns)
    for layer, own in zip(cache.layers, row):
        for n, t in layer.items():
            t[slot] = own[n]
    seq = inputs.shape[0]
    ids = torch.randint(3, 8000, (batch, seq), generator=gen, device=cuda)
    ids[slot] = inputs
    alive = torch.ones((batch, seq), dtype=torch.int64, device=cuda)
    alive[slot] = live
    next_pos = torch.randint(5, window - seq - 1, (batch,), generator=gen, device=cuda)
    next_pos[slot] = HISTORY
    valid = torch.arange(COLUMNS, device=cuda) < next_pos.unsqueeze(1)
    logits, _, _ = _step(model, cache, ids, alive, next_pos, valid, window)
    return logits[slot]


@pytest.mark.gpu
@pytest.mark.parametrize("name", [TEST_MODEL, TEST_DRAFT])
@torch.inference_mode()
def test_a_rows_logits_do_not_depend_on_batch_slot_or_window(name):
    model, base, row, gen = _setup(name)
    cuda = torch.device("cuda")
    tokens = torch.tensor([17, 801, 2345, 99, 4000], device=cuda)
    for seq in (1, 5):
        inputs, live = tokens[:seq], torch.ones(seq, dtype=torch.int64, device=cuda)
        reference = _logits(model, base, row, gen, 1, 0, 128, inputs, live)
        for batch in (1, 2, 4, 8, 16, 64):
            for slot in sorted({0, batch - 1}):
                for window in (128, 256, 512, 1024, COLUMNS):
                    got = _logits(model, base, row, gen, batch, slot, window, inputs, live)
                    assert torch.equal(got, reference), (
                        f"{name}: {seq} inputs, batch {batch}, slot {slot}, window {window}: "
                        f"max |diff| {(got.float() - reference.float()).abs().max().item():.3g}")
    # The draft's two-input step with the first input padding gives the one-input step's logits.
    one = _logits(model, base, row, gen, 4, 1, 256, tokens[:1], torch.ones(1, dtype=torch.int64, device=cuda))
    two = _logits(model, base, row, gen, 4, 1, 256, torch.stack([tokens[1], tokens[0]]),
                  torch.tensor([0, 1], device=cuda))
    assert torch.equal(two[1], one[0]), f"{name}: a left-padded input changes the row's logits"


@pytest.mark.gpu
@pytest.mark.parametrize("name", [TEST_MODEL, TEST_DRAFT])
@torch.inference_mode()
def test_each_linear_is_row_invariant(name):
    """Every matrix product of the forward with M = rows x inputs (batch buckets 1..256
    times 1, 2 or 5 inputs; prefills up to 512): a row's output does not depend on M."""
    from service.engines.local.model import dsv32

    model, _, _, gen = _setup(name)
    cuda = torch.device("cuda")
    weights = {n: m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for n, m in model.named_modules():
        if hasattr(m, "kv_b_proj"):
            w_q, w_o = dsv32.absorbed_weights(m, torch.bfloat16)
            weights[n + ".absorbed_q"], weights[n + ".absorbed_o"] = w_q, w_o
    sizes = sorted({b * s for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) for s in (1, 2, 5)} | {16, 512})
    bad = []
    for n, w in weights.items():
        x = torch.randn((max(sizes), w.shape[1]), generator=gen, device=cuda).to(w.dtype)
        full = torch.nn.functional.linear(x, w)
        for m in sizes:
            if not torch.equal(torch.nn.functional.linear(x[:m], w), full[:m]):
                bad.append((n, tuple(w.shape), m))
    for n, m in model.named_modules():
        if hasattr(m, "gate") and hasattr(m, "experts"):  # the dense MoE
            x = torch.randn((max(sizes), model.config.hidden_size), generator=gen, device=cuda).to(torch.bfloat16)
            full = dsv32._moe(m, x)
            bad += [(n + " moe", None, k) for k in sizes if not torch.equal(dsv32._moe(m, x[:k]), full[:k])]
    assert not bad, f"{name}: products whose rows depend on M: {bad[:20]} ({len(bad)} in all)"
