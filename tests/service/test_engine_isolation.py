"""One request never hurts another inside the local engine: a poison request that fails at
admission, in a batched step, or while its text is emitted fails alone, and every other
tenant's request in the same batch produces exactly the text it produces without it.
The loop thread's death fails in-flight requests with an engine failure, marks the
engine not ready, and the loop restarts by itself."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.engines.base import Delta, EngineFailure, Finished, GenerationRequest, WatermarkPlan
from service.engines.local.engine import LocalEngine
from tests.service.gateway import TEST_DRAFT, TEST_MODEL
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

pytestmark = pytest.mark.slow


def _plan(secret: int, algorithm: str) -> WatermarkPlan:
    key = WatermarkKey(secret, WatermarkSpec(algorithm=algorithm))
    return WatermarkPlan(key=key, key_id=f"k{secret}", version=1, fingerprint=key.fingerprint)


@pytest.fixture(scope="module")
def engine():
    loop = asyncio.new_event_loop()
    # Speculative (dual-key) and plain (single-key) groups both run in this engine.
    engine = LocalEngine(TEST_MODEL, TEST_DRAFT, device="cpu", max_batch=8, speculative_k=3, restart_delay=2.0)
    loop.run_until_complete(engine.start())
    yield loop, engine
    loop.run_until_complete(engine.stop())
    loop.close()


def _tenants(tok) -> list[GenerationRequest]:
    prompts = ["The function returns", "Return a new list", "This module provides", "The value of"]
    algorithms = ["gumbel", "dual_key_gumbel"]
    return [GenerationRequest(f"tenant{i}", tuple(tok.encode(prompts[i])), 80, seed=10 + i,
                              watermark=_plan(500 + i, algorithms[i % 2])) for i in range(4)]


async def _collect(engine, request):
    out = None
    async for event in engine.generate(request):
        if isinstance(event, Finished):
            out = event
    return out


async def _all(engine, requests):
    return await asyncio.gather(*(_collect(engine, r) for r in requests))


async def _with_poison(engine, tenants, poisons):
    """Run ``tenants``; once all are decoding, submit each poison (request, after_admit)."""
    started = asyncio.Event()
    seen = set()

    async def tenant(request):
        out = None
        async for event in engine.generate(request):
            if isinstance(event, Delta):
                seen.add(request.request_id)
                if len(seen) == len(tenants):
                    started.set()
            elif isinstance(event, Finished):
                out = event
        return out

    async def poison(request, after_admit):
        await started.wait()
        try:
            async for _ in _poison_events(engine, request, after_admit):
                pass
        except EngineFailure as exc:
            return exc
        return None

    results = await asyncio.gather(*(tenant(r) for r in tenants), *(poison(r, a) for r, a in poisons))
    return results[:len(tenants)], results[len(tenants):]


async def _poison_events(engine, request, after_admit):
    async for event in engine.generate(request):
        if after_admit is not None:
            state = next((s for s in engine._running if s.request is request), None)  # noqa: SLF001
            if state is not None:
                after_admit(state)
                after_admit = None
        yield event


def _unsampleable(state):
    # A key no int64 tensor can hold: the next batched draw raises for the whole batch.
    state.stream_key = 2**70


def _undecodable(state):
    class Broken:
        def decode(self, *args, **kwargs):
            raise RuntimeError("detokenizer failure")

    state.tracker.tokenizer = Broken()


def test_poison_requests_leave_other_tenants_byte_identical(engine, monkeypatch):
    loop, eng = engine
    tok = eng.tokenizer()
    tenants = _tenants(tok)
    alone = loop.run_until_complete(_all(eng, tenants))
    prompt = tuple(tok.encode("Poison"))
    # The gateway's validation refuses these; the engine must still contain them.
    monkeypatch.setattr(eng, "check", lambda request: None)
    poisons = [
        (GenerationRequest("overflow", prompt, 20, top_k=2**63), None),  # fails at admission
        (GenerationRequest("bad-prompt", (10**9,), 20), None),  # prompt id beyond the vocabulary
        (GenerationRequest("step-plain", prompt, 40, seed=1, watermark=_plan(9, "gumbel")), _unsampleable),
        (GenerationRequest("step-spec", prompt, 40, seed=2, watermark=_plan(8, "dual_key_gumbel")), _unsampleable),
        (GenerationRequest("emit", prompt, 40, seed=3, watermark=_plan(7, "gumbel")), _undecodable),
    ]
    together, errors = loop.run_until_complete(_with_poison(eng, tenants, poisons))
    for request, solo, mixed in zip(tenants, alone, together):
        assert mixed.token_ids == solo.token_ids and mixed.text == solo.text, request.request_id
    assert all(isinstance(e, EngineFailure) for e in errors), errors
    deadline = time.monotonic() + 10
    while eng._running and time.monotonic() < deadline:  # noqa: SLF001 - retired after their last event
        time.sleep(0.05)
    assert not eng._running and eng.ready  # noqa: SLF001


def test_loop_thread_death_fails_in_flight_and_restarts(engine, monkeypatch):
    loop, eng = engine
    tok = eng.tokenizer()
    request = GenerationRequest("victim", tuple(tok.encode("The function returns")), 30, seed=4)
    real_retire = eng._retire  # noqa: SLF001
    calls = {"n": 0}

    def dying_retire():
        calls["n"] += 1
        if calls["n"] == 3:
            raise SystemError("simulated engine thread death")
        real_retire()

    monkeypatch.setattr(eng, "_retire", dying_retire)
    with pytest.raises(EngineFailure):
        loop.run_until_complete(_collect(eng, request))
    assert not eng.ready
    with pytest.raises(EngineFailure):  # refused while down, not queued behind a dead loop
        loop.run_until_complete(_collect(eng, request))
    deadline = time.monotonic() + 30
    while not eng.ready and time.monotonic() < deadline:
        time.sleep(0.1)
    assert eng.ready
    out = loop.run_until_complete(_collect(eng, request))
    assert out is not None and len(out.token_ids) > 0
