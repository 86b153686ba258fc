"""The eager Llama forward (service/engines/local/eager_llama.py) gives transformers' logits
bit for bit on the CPU, through everything a batch group does: prefills, joins of rows of
different lengths (left padding), decode steps, speculative blocks with placeholder inputs,
rejected drafts and compaction, rows leaving, and a rolled-back step. Equality, not
closeness: the engine's texts for a seed must not change with the forward it runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from service.engines.local import cache as kv
from service.engines.local import eager_llama
from service.engines.local.runner import Group, load_model
from service.model_paths import BUNDLED_DRAFT, resolve_model_path


@pytest.fixture(scope="module")
def model():
    return load_model(resolve_model_path(BUNDLED_DRAFT), torch.device("cpu"))


def _pair(model):
    eager, reference = Group(model, torch.device("cpu")), Group(model, torch.device("cpu"))
    assert eager.eager
    reference.eager = False  # transformers' own forward over its DynamicCache
    return eager, reference


def _join(groups, rid, prompt):
    outs = []
    for group in groups:
        cache, mask, logits = group.prefill(prompt)
        group.join(rid, cache, mask, len(prompt))
        outs.append(logits)
    assert torch.equal(outs[0], outs[1])


def _forward(groups, inputs, live=None):
    outs = [group.forward(inputs, live) for group in groups]
    assert torch.equal(outs[0], outs[1])
    return outs[0]


@torch.inference_mode()
def test_logits_equal_transformers_through_a_groups_life(model):
    groups = _pair(model)
    eager, reference = groups
    assert isinstance(eager.cache, type(None)) and not reference.eager
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 8000, (n,), generator=g).tolist() for n in (1, 7, 30, 4)]
    _join(groups, "a", prompts[0])
    for _ in range(3):  # one row alone: no padding, the mask-free attention
        _forward(groups, torch.randint(3, 8000, (1, 1), generator=g))
    for i, prompt in enumerate(prompts[1:]):  # joins of other lengths: left padding
        _join(groups, f"r{i}", prompt)
        _forward(groups, torch.randint(3, 8000, (len(eager), 1), generator=g))
    assert isinstance(eager.cache, kv.GrowingCache) and torch.equal(eager.mask, reference.mask)
    for step in range(12):
        n = 1 + step % 4
        inputs = torch.randint(3, 8000, (len(eager), n), generator=g)
        live = torch.ones_like(inputs)
        if n > 1:
            live[0, 0] = 0  # a placeholder input (the draft model's left-padded inputs)
        _forward(groups, inputs, live)
        counts = torch.tensor([(step + b) % n for b in range(len(eager))])
        for group in groups:  # rejected drafts become holes, then compaction squeezes them out
            group.reject_tail(counts)
        assert torch.equal(eager.mask, reference.mask)
    assert eager.compactions == reference.compactions > 0
    for group in groups:
        group.keep(["a", "r1"])
    _forward(groups, torch.randint(3, 8000, (2, 1), generator=g))

    saved = eager.snapshot()  # a failed step is rolled back: the next step sees the old cache
    eager.forward(torch.randint(3, 8000, (2, 3), generator=g))
    eager.restore(saved)
    _forward(groups, torch.randint(3, 8000, (2, 1), generator=g))


def test_growing_layer_appends_in_place_and_reallocates_after_surgery():
    layer = kv.GrowingLayer()
    first = torch.randn(2, 1, 3, 4)
    keys, _ = layer.append(first, first)
    second = torch.randn(2, 1, 1, 4)
    grown, _ = layer.append(second, second)
    assert grown.data_ptr() == keys.data_ptr()  # the same buffer, written in place
    assert torch.equal(grown, torch.cat([first, second], dim=2)) and torch.equal(keys, first)
    layer.keys = layer.values = grown.index_select(0, torch.tensor([1]))  # surgery replaced them
    third = torch.randn(1, 1, 2, 4)
    moved, _ = layer.append(third, third)
    assert torch.equal(moved, torch.cat([grown[1:], third], dim=2))


@torch.inference_mode()
def test_head_gives_f_linear_bits_for_every_row_count(model):
    head = eager_llama.Head(model.lm_head.weight)
    g = torch.Generator().manual_seed(3)
    for rows in range(1, 21):
        x = torch.randn((2, rows, 2 * model.config.hidden_size), generator=g)[..., ::2] * 2  # non-contiguous
        assert torch.equal(head(x), F.linear(x, model.lm_head.weight)), rows
        assert torch.equal(head(x[:1]), F.linear(x[:1], model.lm_head.weight)), rows
