"""Admission of a burst and the streamer's rest (issue 33): a round of requests submitted at
once is admitted in one go, a lone request at once; a threaded streamer that rests between
passes gives each request one Delta for the blocks that came meanwhile, with the same text."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from service.engines.base import Delta, Finished, GenerationRequest, RouteCounts
from service.engines.local.engine import LocalEngine
from service.engines.local.request import RequestState
from service.engines.local.streamer import Streamer
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL


def _requests(engine: LocalEngine, n: int, tokens: int = 3) -> list[GenerationRequest]:
    tok = engine.tokenizer()
    return [GenerationRequest(f"r{i}", tuple(tok.encode(["The function", "Return a"][i % 2])), tokens, seed=i)
            for i in range(n)]


async def _generate(engine: LocalEngine, requests: list[GenerationRequest], waves: int = 1) -> list[Finished]:
    """Every request's Finished; ``waves``: submitted in that many waves 10 ms apart (a burst
    whose requests the idle engine does not all find waiting when it wakes)."""
    async def one(request):
        async for event in engine.generate(request):
            if isinstance(event, Finished):
                return event

    size = -(-len(requests) // waves)
    tasks = []
    for start in range(0, len(requests), size):
        if tasks:
            await asyncio.sleep(0.01)
        tasks += [asyncio.ensure_future(one(r)) for r in requests[start:start + size]]
    return await asyncio.gather(*tasks)


def test_a_burst_is_admitted_once_and_a_lone_request_at_once(monkeypatch):
    from service.engines.local import engine as engine_module

    # A quiet period longer than a loaded machine's scheduling gaps (1 ms in service), so
    # that the test shows the mechanism, not this machine's timing; a lone request never waits.
    monkeypatch.setattr(engine_module, "ADMIT_QUIET", 0.05)
    monkeypatch.setattr(engine_module, "ADMIT_SETTLE", 2.0)

    async def go():
        engine = LocalEngine(TEST_MODEL, TEST_DRAFT, max_batch=16, speculative_k=4)
        await engine.start()
        sizes: list[int] = []
        original = engine._admit_all

        def admit_all(states):
            sizes.append(len(states))
            return original(states)

        engine._admit_all = admit_all
        try:
            burst = await _generate(engine, _requests(engine, 12), waves=2)
            burst_sizes = list(sizes)
            sizes.clear()
            alone = await _generate(engine, _requests(engine, 1, tokens=1))
            return burst, burst_sizes, alone, list(sizes)
        finally:
            await engine.stop()

    burst, burst_sizes, alone, alone_sizes = asyncio.run(go())
    assert all(len(f.token_ids) == 3 for f in burst) and len(alone[0].token_ids) == 1
    assert burst_sizes == [12], burst_sizes  # without the settle: [6, 6]
    assert alone_sizes == [1]


def test_a_resting_streamer_merges_blocks_into_one_delta_with_the_same_text():
    from transformers import AutoTokenizer

    from service.model_paths import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(TEST_MODEL))
    rng = np.random.default_rng(0)
    blocks = [rng.integers(3, 4000, (2, 2)) for _ in range(6)]

    def run(rest_ratio: float, pause: float) -> tuple[list[list], list[str]]:
        events: list[list] = [[], []]
        streamer = Streamer(threaded=True, rest_ratio=rest_ratio)
        states = [RequestState(GenerationRequest(f"r{i}", (5, 6), 100, seed=i), tok, frozenset(), events[i].append,
                               streamer=streamer) for i in range(2)]
        for tokens in blocks:
            streamer.block(states, np.arange(2), tokens, np.full(2, 2), np.zeros((2, 4), dtype=np.int64))
            time.sleep(pause)
        assert streamer.wait(10)
        return events, [tok.decode([int(t) for b in blocks for t in b[i]], skip_special_tokens=True) for i in range(2)]

    # With no rest and a pause after each block, one Delta per block; resting (a large
    # ratio: MAX_REST, 20 ms), the blocks posted 5 ms apart during a rest are one pass's.
    eager, texts = run(0.0, 0.05)
    rested, _ = run(1e6, 0.005)
    for i in range(2):
        for events in (eager[i], rested[i]):
            assert all(isinstance(e, Delta) for e in events)
            assert "".join(e.text for e in events) == texts[i]
            assert [t for e in events for t in e.token_ids] == [int(t) for b in blocks for t in b[i]]
        assert len(eager[i]) == len(blocks)
        assert len(rested[i]) < len(blocks)


def test_a_request_end_cuts_the_streamers_rest_short(monkeypatch):
    from transformers import AutoTokenizer

    from service.engines.local import streamer as streamer_module
    from service.model_paths import resolve_model_path

    monkeypatch.setattr(streamer_module, "MAX_REST", 30.0)  # a rest far longer than the test
    tok = AutoTokenizer.from_pretrained(resolve_model_path(TEST_MODEL))
    events: list = []
    streamer = Streamer(threaded=True, rest_ratio=1e9)
    state = RequestState(GenerationRequest("r", (5, 6), 100, seed=0), tok, frozenset(), events.append,
                         streamer=streamer)
    streamer.block([state], np.arange(1), np.array([[300, 301]]), np.full(1, 2), np.zeros((1, 4), dtype=np.int64))
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:  # the first pass ran: the thread now rests
        time.sleep(0.01)
    streamer.finish(state, Finished(text="", token_ids=(300, 301), finish_reason="length", prompt_tokens=2,
                                    routes=RouteCounts(key_a=0, key_b=0, plain=2, greedy=0)))
    started = time.monotonic()
    while not any(isinstance(e, Finished) for e in events) and time.monotonic() < started + 10:
        time.sleep(0.01)
    assert isinstance(events[-1], Finished) and time.monotonic() - started < 5
