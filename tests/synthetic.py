"""Synthetic watermarked text: the production sampler and deduper driven by a random
"language model" whose next-token logits are drawn per position (entropy controlled by
``scale``). Used to test detection end to end without a real model."""

from __future__ import annotations

import numpy as np
import torch

from watermark import dispatch, sampler, speculative, stream
from watermark.prf import philox_torch
from watermark.dedup import ContextDeduper
from watermark.key import WatermarkKey


def generate(key: WatermarkKey, n: int, *, vocab: int = 2000, scale: float = 2.0, seed: int = 0,
             prompt: tuple[int, ...] = ()) -> tuple[list[int], list[int]]:
    """(token ids, routes) of an n-token text generated under ``key`` one token at a time."""
    gen = torch.Generator().manual_seed(seed)
    spec = key.spec
    dedup = ContextDeduper(spec.context_width, spec.dedup, spec.dedup_max_history, prompt=prompt)
    tokens, routes = [], []
    for position in range(n):
        logits = torch.randn(1, vocab, generator=gen) * scale
        rows = sampler.sampler_rows([key.row_keys()], contexts=[dedup.context], watermark=[not dedup.next_repeated()],
                                    greedy=[False], stream_keys=[stream.stream_key(seed)], positions=[position])
        result = dispatch.sample(logits, rows)
        token = int(result.tokens[0])
        tokens.append(token)
        routes.append(int(result.routes[0]))
        dedup.push(token)
    return tokens, routes


def generate_speculative(key: WatermarkKey, n: int, *, k: int = 4, vocab: int = 500, scale: float = 2.0,
                         draft_noise: float = 0.7, seed: int = 0) -> tuple[list[int], list[int]]:
    """Speculative generation with a draft whose logits are the target's plus noise."""
    gen = torch.Generator().manual_seed(seed)
    spec = key.spec
    dedup = ContextDeduper(spec.context_width, spec.dedup, spec.dedup_max_history)
    stream_key = philox_torch.keys_tensor([stream.stream_key(seed)])
    keyed = spec.coin == "keyed"
    tokens, routes = [], []
    while len(tokens) < n:
        target = torch.randn(k + 1, vocab, generator=gen) * scale
        draft = target[:k] + torch.randn(k, vocab, generator=gen) * draft_noise
        drafts = []
        for j in range(k):
            decisions = dedup.block_repeated(drafts)
            context = speculative.block_contexts(dedup.context, drafts)[j]
            rows = sampler.sampler_rows([key.row_keys()], contexts=[context], watermark=[not decisions[j]],
                                        greedy=[False], stream_keys=[stream.stream_key(seed)],
                                        positions=[len(tokens) + j], routed=False)
            drafts.append(int(dispatch.sample(draft[j:j + 1], rows, lane=stream.LANE_DRAFT).tokens[0]))
        decisions = dedup.block_repeated(drafts)
        rows = speculative.VerifyRows(
            key_b=philox_torch.keys_tensor([key.key_b]), key_coin=philox_torch.keys_tensor([key.key_coin]),
            keyed_coin=torch.tensor([keyed]), contexts=[speculative.block_contexts(dedup.context, drafts)],
            watermark=torch.tensor([[not d for d in decisions]]), greedy=torch.tensor([False]),
            stream_keys=stream_key, positions=torch.tensor([len(tokens)]))
        result = dispatch.verify(torch.softmax(target, -1).unsqueeze(0), torch.softmax(draft, -1).unsqueeze(0),
                                    torch.tensor([drafts]), rows)
        emitted = int(result.num_accepted[0]) + 1
        for j in range(emitted):
            tokens.append(int(result.tokens[0, j]))
            routes.append(int(result.routes[0, j]))
            dedup.push(tokens[-1])
    return tokens[:n], routes[:n]


def human_like(n: int, *, vocab: int = 2000, seed: int = 0) -> list[int]:
    """Unwatermarked text with repetition (Zipf tokens and copied phrases)."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.2:
            start = int(rng.integers(0, len(out)))
            out.extend(out[start:start + int(rng.integers(2, 12))])
        else:
            out.append(int(min(vocab - 1, rng.zipf(1.3))))
    return out[:n]
