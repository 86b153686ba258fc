"""The local engine on the bundled models: continuous batching gives each request the text
it would get alone; speculation keeps requests deterministic for a seed; cancellation."""

from __future__ import annotations

import asyncio

import pytest

from detector.detect import detect
from detector.result import Candidate
from service.engines.base import Delta, Finished, GenerationRequest, RouteCounts, WatermarkPlan
from service.engines.local.engine import LocalEngine, caught_up
from tests.service.gateway import TEST_DRAFT, TEST_MODEL
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

pytestmark = pytest.mark.slow


def _plan(secret: int, algorithm: str) -> WatermarkPlan:
    key = WatermarkKey(secret, WatermarkSpec(algorithm=algorithm))
    return WatermarkPlan(key=key, key_id=f"k{secret}", version=1, fingerprint=key.fingerprint)


async def _run(engine, requests):
    async def one(request):
        async for event in engine.generate(request):
            if isinstance(event, Finished):
                return event

    return await asyncio.gather(*(one(r) for r in requests))


@pytest.fixture(scope="module")
def engines():
    loop = asyncio.new_event_loop()
    plain = LocalEngine(TEST_MODEL, None, device="cpu", max_batch=8)
    spec = LocalEngine(TEST_MODEL, TEST_DRAFT, device="cpu", max_batch=8, speculative_k=3)
    loop.run_until_complete(plain.start())
    loop.run_until_complete(spec.start())
    yield loop, plain, spec
    loop.run_until_complete(plain.stop())
    loop.run_until_complete(spec.stop())
    loop.close()


def _requests(tok, n=6, tokens=40):
    prompts = ["The function returns", "Return a new list", "This module provides"]
    algorithms = ["gumbel", "dual_key_gumbel"]
    return [GenerationRequest(f"r{i}", tuple(tok.encode(prompts[i % 3] * (1 + i % 2))), tokens, seed=i,
                              watermark=_plan(100 + i, algorithms[i % 2]) if i < n - 1 else None)
            for i in range(n)]


@pytest.mark.parametrize("which", ["plain", "spec"])
def test_batched_equals_alone(engines, which):
    loop, plain, spec = engines
    engine = plain if which == "plain" else spec
    requests = _requests(engine.tokenizer())
    together = loop.run_until_complete(_run(engine, requests))
    for request, out in zip(requests, together):
        alone = loop.run_until_complete(_run(engine, [request]))[0]
        assert alone.token_ids == out.token_ids, request.request_id


def test_requests_join_a_running_batch(engines):
    loop, _, spec = engines
    tok = spec.tokenizer()
    long = GenerationRequest("long", tuple(tok.encode("The function returns")), 60, seed=1,
                             watermark=_plan(7, "dual_key_gumbel"))
    late = GenerationRequest("late", tuple(tok.encode("This module provides")), 20, seed=2,
                             watermark=_plan(8, "dual_key_gumbel"))

    async def staggered():
        first = asyncio.ensure_future(_run(spec, [long]))
        await asyncio.sleep(0.3)
        second = await _run(spec, [late])
        return (await first)[0], second[0]

    joined_long, joined_late = loop.run_until_complete(staggered())
    assert joined_long.token_ids == loop.run_until_complete(_run(spec, [long]))[0].token_ids
    assert joined_late.token_ids == loop.run_until_complete(_run(spec, [late]))[0].token_ids


def test_outputs_are_watermarked_under_their_own_key(engines):
    loop, _, spec = engines
    requests = _requests(spec.tokenizer(), tokens=120)
    outs = loop.run_until_complete(_run(spec, requests))
    for request, out in zip(requests, outs):
        if request.watermark is None:
            assert out.routes.watermarked == 0
            continue
        assert detect(out.token_ids, [Candidate.inline(request.watermark.key)]).log10_p_value < -6
        other = WatermarkKey(request.watermark.key.secret + 1, request.watermark.key.spec)
        assert detect(out.token_ids, [Candidate.inline(other)]).log10_p_value > -4


def test_stop_strings_and_max_tokens(engines):
    loop, plain, _ = engines
    tok = plain.tokenizer()
    free = loop.run_until_complete(_run(plain, [GenerationRequest("a", tuple(tok.encode("The function")), 30, seed=3)]))[0]
    assert free.finish_reason in ("length", "stop") and len(free.token_ids) <= 30
    stop = free.text[5:7] if len(free.text) > 8 else None
    if stop:
        cut = loop.run_until_complete(_run(plain, [GenerationRequest("b", tuple(tok.encode("The function")), 30,
                                                                     seed=3, stop=(stop,))]))[0]
        assert cut.finish_reason == "stop" and stop not in cut.text and free.text.startswith(cut.text)


def test_a_consumer_behind_gets_the_queued_deltas_as_one():
    """LocalEngine.generate hands a consumer that fell behind (a stream awaiting its ledger
    checkpoint) every Delta already queued as one event, and the event after them next."""
    queue: asyncio.Queue = asyncio.Queue()
    first = Delta(text="a", token_ids=(1,), routes=RouteCounts(key_a=1))
    for event in (Delta(text="b", token_ids=(2, 3), routes=RouteCounts(key_a=3)),
                  Delta(text="c", token_ids=(4,), routes=None)):
        queue.put_nowait(event)
    end = Finished(text="abc", token_ids=(1, 2, 3, 4), finish_reason="length", prompt_tokens=1,
                   routes=RouteCounts(key_a=4))
    queue.put_nowait(end)
    queue.put_nowait("not taken")
    event, held = caught_up(queue, first)
    assert event == Delta(text="abc", token_ids=(1, 2, 3, 4), routes=RouteCounts(key_a=3)) and held is end
    assert caught_up(queue, end) == (end, None) and queue.qsize() == 1  # only Deltas merge
