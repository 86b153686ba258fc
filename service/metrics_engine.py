"""The local engine's telemetry as Prometheus metrics (``hallmark_engine_*``), read at scrape
time from ``service.engines.local.telemetry.EngineTelemetry`` (a custom collector: nothing
is pushed from the engine thread, so the step loop pays only its hook's host arithmetic)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from service.engines.local.telemetry import BLOCK_BUCKETS


class EngineCollector:
    def __init__(self, engine) -> None:
        self.engine = engine  # its ``telemetry`` appears once the engine has loaded

    def describe(self):
        return []  # collected lazily; the names are fixed and documented in collect()

    def collect(self):
        t = self.engine.telemetry
        if t is None:
            return
        counts = t.snapshot()
        in_use = GaugeMetricFamily("hallmark_engine_kv_cache_tokens_in_use",
                                   "Live KV-cache tokens (rows x columns attended), per batch group.", labels=["group"])
        capacity = GaugeMetricFamily("hallmark_engine_kv_cache_tokens_capacity",
                                     "Allocated KV-cache tokens (rows x columns), per batch group.", labels=["group"])
        indexer = GaugeMetricFamily("hallmark_engine_indexer_keys_cached",
                                    "Live sparse-attention indexer keys cached (live tokens x indexer layers).",
                                    labels=["group"])
        for sample in t.sample_groups():
            in_use.add_metric([sample.name], sample.in_use)
            capacity.add_metric([sample.name], sample.capacity)
            indexer.add_metric([sample.name], sample.in_use * sample.indexer_layers)
        yield in_use
        yield capacity
        yield indexer
        forwards = CounterMetricFamily("hallmark_engine_forwards",
                                       "Model forward passes by mode: CUDA-graph replays or eager (fallback).",
                                       labels=["group", "mode"])
        compactions = CounterMetricFamily("hallmark_engine_kv_hole_compactions",
                                          "KV-cache compactions squeezing out rejected-draft holes.", labels=["group"])
        for name, (replays, eager, compacted) in t.forward_counts().items():
            forwards.add_metric([name, "graph_replay"], replays)
            forwards.add_metric([name, "eager"], eager)
            compactions.add_metric([name], compacted)
        yield forwards
        yield compactions
        queries = CounterMetricFamily("hallmark_engine_attention_queries",
                                      "Target-model attention queries: sparse (the indexer's top-k of a longer "
                                      "context) or dense (context within top-k, or a dense model).", labels=["mode"])
        queries.add_metric(["sparse"], counts["sparse_queries"])
        queries.add_metric(["dense"], counts["dense_queries"])
        yield queries
        total = counts["sparse_queries"] + counts["dense_queries"]
        yield GaugeMetricFamily("hallmark_engine_sparse_attention_share",
                                "Share of target attention queries served by the indexer's top-k since start.",
                                value=counts["sparse_queries"] / total if total else 0.0)
        yield CounterMetricFamily("hallmark_engine_steps", "Engine steps.", value=counts["steps"])
        cumulative, buckets = 0, []
        for bound, n in zip([str(b) for b in BLOCK_BUCKETS] + ["+Inf"], counts["block_counts"]):
            cumulative += n
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily("hallmark_engine_speculative_blocks_per_step",
                                    "Speculative blocks (rows drafting k tokens) per engine step.",
                                    buckets=buckets, sum_value=counts["blocks_total"])
