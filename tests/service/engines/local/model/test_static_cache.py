"""Our static-cache forward (service/engines/local/model) against transformers' own logits,
for the bundled target (DeepSeek-V3.2-style: MLA + indexer + MoE) and draft (Llama), in
float32 on the CPU: a batched prefill of prompts of different lengths (one longer than the
indexer's top-k, so the sparse selection is exercised), then decode steps of one token and
a speculative-style verify step of several, each row compared with transformers running
that row alone. Tolerance: |ours - theirs| <= 1e-4 + 1e-4 |theirs| per logit (float32
summation-order differences are ~1e-6 here; a wrong mask, position or expert is ~1e-1)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from service.engines.local.model import StaticCache, forward
from service.engines.local.runner import load_model
from service.model_paths import resolve_model_path

ATOL = RTOL = 1e-4
COLUMNS = 128
SCRATCH = COLUMNS - 1  # padding inputs are written here; no row counts it as valid


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (80, 9)]


class _Reference:
    """One row through transformers alone."""

    def __init__(self, model, prompt):
        self.model, self.cache = model, DynamicCache(config=model.config)
        self.logits = self._run(prompt)

    def _run(self, ids):
        x = torch.tensor([ids])
        past = self.cache.get_seq_length()
        mask = torch.ones((1, past + len(ids)), dtype=torch.int64)
        return self.model(input_ids=x, attention_mask=mask, past_key_values=self.cache, use_cache=True).logits[0]

    def step(self, ids):
        return self._run(ids)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bundled", "hallmark-tiny-draft"])
@torch.inference_mode()
def test_logits_equal_transformers(name):
    model = load_model(resolve_model_path(name), torch.device("cpu"))
    prompts = _prompts(model.config.vocab_size)
    refs = [_Reference(model, p) for p in prompts]
    cache = StaticCache.for_model(model, slots=len(prompts), columns=COLUMNS, device="cpu", dtype=torch.float32)

    # Batched prefill: row b's prompt at columns 0..len-1, padding inputs to the scratch column.
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.int64)
    cols = torch.full((len(prompts), width), SCRATCH, dtype=torch.int64)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
        cols[b, :len(p)] = torch.arange(len(p))
    lengths = [len(p) for p in prompts]
    valid = torch.zeros((len(prompts), COLUMNS), dtype=torch.bool)
    for b, n in enumerate(lengths):
        valid[b, :n] = True
    logits = forward(model, cache, ids, cols.clamp(max=SCRATCH), cols, valid)
    for b, ref in enumerate(refs):
        torch.testing.assert_close(logits[b, :lengths[b]], ref.logits, atol=ATOL, rtol=RTOL)

    # Decode: 3 single-token steps, then a 4-token verify step (as speculation feeds the target).
    for n_in in (1, 1, 1, 4):
        new = [[(7 * b + 11 * n + j) % model.config.vocab_size for j in range(n_in)]
               for b, n in enumerate(lengths)]
        cols = torch.tensor([[n + j for j in range(n_in)] for n in lengths])
        for b, n in enumerate(lengths):
            valid[b, n:n + n_in] = True
        logits = forward(model, cache, torch.tensor(new), cols, cols, valid)
        for b, ref in enumerate(refs):
            torch.testing.assert_close(logits[b], ref.step(new[b]), atol=ATOL, rtol=RTOL)
        lengths = [n + n_in for n in lengths]
    assert lengths[0] > model.config.get_text_config().to_dict().get("index_topk", 0)
