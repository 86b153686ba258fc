"""Engine telemetry: the step hook's counting rules, and the /metrics export of a real run."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.engines.base import Finished, GenerationRequest, WatermarkPlan
from service.engines.local.engine import LocalEngine
from service.engines.local.telemetry import EngineTelemetry, StepReport
from service.metrics import Metrics
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def test_sparse_queries_are_those_with_more_keys_than_topk():
    t = EngineTelemetry(index_topk=64)
    # plain rows: one query attending to `length` keys
    t.on_step(StepReport(plain_lengths=(10, 64, 65), speculative_lengths=(), k=4))
    assert (t.sparse_queries, t.dense_queries) == (1, 2)
    # speculative rows: k + 1 queries attending to length .. length + k keys
    t.on_step(StepReport(plain_lengths=(), speculative_lengths=(60, 62, 100), k=4))
    assert (t.sparse_queries, t.dense_queries) == (1 + 0 + 2 + 5, 2 + 5 + 3 + 0)
    snap = t.snapshot()
    assert snap["steps"] == 2 and snap["blocks_total"] == 3
    assert snap["block_counts"][0] == 1  # the plain-only step: 0 blocks
    assert sum(snap["block_counts"]) == 2


def test_dense_model_counts_no_queries():
    t = EngineTelemetry(index_topk=None)
    t.on_step(StepReport(plain_lengths=(1000,), speculative_lengths=(), k=4))
    assert t.sparse_queries == t.dense_queries == 0


def _values(metrics: Metrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.mark.slow
def test_metrics_export_a_speculative_run():
    engine = LocalEngine(TEST_MODEL, TEST_DRAFT, device="cpu", max_batch=8, speculative_k=3)
    metrics = Metrics()
    metrics.watch_engine(engine)
    assert not any(k[0].startswith("hallmark_engine") for k in _values(metrics))  # nothing before load
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    samples = []
    engine.step_hooks.append(lambda report: samples.append(engine.telemetry.sample_groups()))
    try:
        tok = engine.tokenizer()
        long_prompt = tuple(tok.encode("Return a new list of the items in the sequence. " * 8))
        assert len(long_prompt) > 64  # beyond the bundled target's index_topk: sparse queries
        key = WatermarkKey(7, WatermarkSpec(algorithm="dual_key_gumbel"))
        plan = WatermarkPlan(key=key, key_id="k", version=1, fingerprint=key.fingerprint)
        requests = [GenerationRequest("long", long_prompt, 24, seed=1, watermark=plan),
                    GenerationRequest("short", tuple(tok.encode("The function")), 24, seed=2, watermark=plan)]

        async def run():
            async def one(r):
                async for event in engine.generate(r):
                    if isinstance(event, Finished):
                        return event
            return await asyncio.gather(*(one(r) for r in requests))

        loop.run_until_complete(run())
    finally:
        loop.run_until_complete(engine.stop())
        loop.close()

    v = _values(metrics)
    steps = v[("hallmark_engine_steps_total", ())]
    assert steps == len(samples) > 0
    assert v[("hallmark_engine_attention_queries_total", (("mode", "sparse"),))] > 0
    assert v[("hallmark_engine_attention_queries_total", (("mode", "dense"),))] > 0
    assert 0 < v[("hallmark_engine_sparse_attention_share", ())] < 1
    assert v[("hallmark_engine_speculative_blocks_per_step_count", ())] == steps
    assert v[("hallmark_engine_speculative_blocks_per_step_sum", ())] >= steps  # one or two blocks each step
    eager = v[("hallmark_engine_forwards_total", (("group", "speculative_target"), ("mode", "eager")))]
    assert eager >= steps  # one verify forward per step (plus prefills)
    assert v[("hallmark_engine_forwards_total", (("group", "speculative_target"), ("mode", "graph_replay")))] == 0
    assert ("hallmark_engine_kv_hole_compactions_total", (("group", "speculative_target"),)) in v
    # Mid-run occupancy, read as /metrics reads it: live <= allocated; the sparse target caches
    # indexer keys in every layer, the dense draft none.
    first = {s.name: s for s in samples[0]}
    target, draft = first["speculative_target"], first["speculative_draft"]
    assert 0 < target.in_use <= target.capacity and 0 < draft.in_use <= draft.capacity
    assert target.indexer_layers == 4 and draft.indexer_layers == 0
    assert target.in_use >= len(long_prompt)
    # After the run every row has left.
    assert v[("hallmark_engine_kv_cache_tokens_in_use", (("group", "speculative_target"),))] == 0
