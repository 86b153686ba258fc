"""Speculative decoding with 256-bit dual keys (``hmac-sha256-philox-v1``) in the local engine on
the CPU: such requests speculate (drafts under key A, verification with key B and the keyed coin
through their HMAC-derived Philox keys and states), every engine path gives the same tokens,
a batch's 64-bit rows are unchanged by 256-bit neighbours, greedy requests give the
non-speculative engine's tokens (what the scheme promises for temperature 0), and the text is
detected under its own key only."""

from __future__ import annotations

import asyncio

import pytest

from detector.detect import detect
from detector.result import Candidate, salted_candidates
from service.engines.base import Finished, GenerationRequest, WatermarkPlan, finish_all
from service.engines.local.engine import LocalEngine
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

pytestmark = pytest.mark.slow

WIDE = dict(prf="hmac-sha256-philox-v1", algorithm="dual_key_gumbel")


def _plan(secret: int, salt: int | None = None, **spec) -> WatermarkPlan:
    key = WatermarkKey(secret, WatermarkSpec(**spec)).with_salt(salt)
    return WatermarkPlan(key=key, key_id=f"w{secret % 1000}", version=1, fingerprint=key.fingerprint)


def _requests(tok, tokens: int = 40) -> list[GenerationRequest]:
    cases = [
        dict(watermark=_plan(2**255 + 11, **WIDE)),
        dict(watermark=_plan(2**256 - 12, coin="keyed", **WIDE)),
        dict(watermark=_plan(2**200 + 13, salt=5, mode="diverse", **WIDE)),
        dict(watermark=_plan(2**255 + 14, context_width=7, **WIDE)),  # two inner HMAC blocks
        dict(watermark=_plan(15, algorithm="dual_key_gumbel")),  # a 64-bit neighbour
        dict(watermark=None),
        dict(watermark=_plan(2**255 + 16, **WIDE), temperature=0.0),
    ]
    prompts = ("The function returns", "Return a new list of the items", "This module provides")
    return [GenerationRequest(f"w{i}", tuple(tok.encode(prompts[i % 3])), tokens - 2 * i, seed=700 + i, **case)
            for i, case in enumerate(cases)]


def _run(requests_of, alone_rows=(0, 4), **options) -> tuple[list[GenerationRequest], list[Finished], list[Finished]]:
    """The request set together and (for its first and 64-bit rows) alone, on one engine."""
    async def go():
        engine = LocalEngine(TEST_MODEL, options.pop("draft", TEST_DRAFT), max_batch=8, speculative_k=3,
                             device="cpu", **options)
        await engine.start()
        try:
            requests = requests_of(engine.tokenizer())
            together = await finish_all(engine, requests)
            alone = [(await finish_all(engine, [requests[i]]))[0] for i in alone_rows]
            return requests, together, alone
        finally:
            await engine.stop()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def dynamic():
    return _run(_requests)


def test_256_bit_dual_keys_speculate_and_are_detected_under_their_key(dynamic):
    requests, together, _ = dynamic
    for request, out in zip(requests, together):
        plan = request.watermark
        if plan is None or plan.key.spec.key_bits != 256 or request.temperature == 0.0:
            continue
        assert out.drafted_tokens > 0 and out.accepted_tokens > 0, request.request_id
        assert out.routes.key_a > 0 and out.routes.key_b > 0, request.request_id  # drafts and corrections
        key = plan.key
        candidate = Candidate.inline(key.with_salt(None)) if key.salt is not None else Candidate.inline(key)
        result = detect(out.token_ids, salted_candidates([candidate]))
        assert result.log10_p_value < -4, (request.request_id, result.log10_p_value)
        other = WatermarkKey(key.secret ^ 1, key.spec)
        assert detect(out.token_ids, salted_candidates([Candidate.inline(other)])).log10_p_value > -3


def test_batched_equals_alone_and_64_bit_rows_are_unchanged(dynamic):
    _, together, alone = dynamic
    assert alone[0].token_ids == together[0].token_ids
    assert alone[1].token_ids == together[4].token_ids


def test_greedy_256_bit_requests_give_the_non_speculative_tokens(dynamic):
    requests, together, _ = dynamic
    _, plain, _ = _run(lambda tok: [requests[6]], alone_rows=(), draft=None)
    assert together[6].token_ids == plain[0].token_ids
    assert together[6].drafted_tokens > 0


def test_the_block_function_gives_the_dynamic_path_tokens(dynamic):
    """static_cache + speculative_blocks: the CUDA path's block function (eagerly here), with
    the 256-bit rows' midstates in its buffers."""
    _, together, _ = dynamic
    _, blocks, _ = _run(_requests, static_cache=True, speculative_blocks=True)
    for i, (a, b) in enumerate(zip(together, blocks)):
        assert a.token_ids == b.token_ids, i
        assert a.routes == b.routes, i
