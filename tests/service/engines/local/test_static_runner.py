"""The engine over static KV caches (service/engines/local/static_runner.py): on the CPU
(eager; CUDA graphs only on CUDA) it gives the same texts as the dynamic-cache engine, and
a request's text does not depend on its batch. The GPU test replays CUDA graphs."""

from __future__ import annotations

import asyncio

import pytest
import torch

from service.engines.base import Finished, GenerationRequest, WatermarkPlan
from service.engines.local.engine import LocalEngine
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def _requests(tok, tokens=24):
    prompts = ["The function returns", "Return a new list of the items in the sequence. " * 8, "This module"]
    out = []
    for i in range(5):
        key = WatermarkKey(300 + i, WatermarkSpec(algorithm=("gumbel", "dual_key_gumbel")[i % 2]))
        plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint) if i < 4 else None
        out.append(GenerationRequest(f"r{i}", tuple(tok.encode(prompts[i % 3])), tokens, seed=i, watermark=plan))
    return out


def _run(engine, requests):
    async def go():
        async def one(r):
            async for event in engine.generate(r):
                if isinstance(event, Finished):
                    return event.token_ids
        return await asyncio.gather(*(one(r) for r in requests))
    return asyncio.run_coroutine_threadsafe(go(), engine._test_loop).result()  # noqa: SLF001


def _engine(device, **kwargs):
    import threading

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engine = LocalEngine(TEST_MODEL, TEST_DRAFT, device=device, max_batch=8, speculative_k=3, **kwargs)
    asyncio.run_coroutine_threadsafe(engine.start(), loop).result()
    engine._test_loop = loop  # noqa: SLF001
    return engine


def _stop(engine):
    asyncio.run_coroutine_threadsafe(engine.stop(), engine._test_loop).result()  # noqa: SLF001
    engine._test_loop.call_soon_threadsafe(engine._test_loop.stop)  # noqa: SLF001


@pytest.mark.slow
def test_static_cache_engine_matches_dynamic_and_is_batch_independent():
    dynamic = _engine("cpu", static_cache=False)
    static = _engine("cpu", static_cache=True)
    try:
        requests = _requests(static.tokenizer())
        batched = _run(static, requests)
        assert batched == _run(dynamic, requests)
        for request, tokens in zip(requests, batched):
            assert _run(static, [request]) == [tokens]
        assert static.telemetry.forward_counts()["speculative_target"][1] > 0  # eager on the CPU
    finally:
        _stop(dynamic)
        _stop(static)


@pytest.mark.gpu
def test_cuda_graph_engine_is_batch_independent_and_replays():
    engine = _engine("cuda")
    try:
        requests = _requests(engine.tokenizer())
        batched = _run(engine, requests)
        alone = [_run(engine, [r])[0] for r in requests]
        counts = engine.telemetry.forward_counts()
        assert counts["speculative_target"][0] > 0 and counts["plain"][0] > 0  # graph replays
        assert batched == alone
    finally:
        _stop(engine)
