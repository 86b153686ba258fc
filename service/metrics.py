"""Prometheus metrics (prefix ``hallmark_``), one registry per app instance."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.metrics_core import Metric

from service.engines.base import Finished

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


# No ``*_created`` samples: a series' creation time dates its first event (the first request
# of a route and status, the first 500) to the microsecond for anyone who can scrape.
disable_created_metrics()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("hallmark_http_requests", "HTTP requests by route, method and status.",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("hallmark_http_request_duration_seconds", "HTTP request latency by route.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.generated_tokens = Counter("hallmark_generated_tokens", "Output tokens generated.",
                                        ["engine"], registry=r)
        self.watermarked_tokens = Counter("hallmark_watermarked_tokens", "Output tokens carrying the watermark.",
                                          ["engine", "key"], registry=r)
        self.watermarked_share = Histogram("hallmark_watermarked_share", "Share of a generation's tokens watermarked.",
                                           buckets=(0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0), registry=r)
        self.dedup_skips = Counter("hallmark_dedup_skipped_tokens",
                                   "Tokens sampled without the watermark because their context repeated.",
                                   registry=r)
        self.unwatermarked = Counter("hallmark_unwatermarked_generations", "Generations without a watermark.",
                                     ["reason"], registry=r)
        self.spec_drafted = Counter("hallmark_speculative_drafted_tokens", "Draft tokens proposed.", registry=r)
        self.spec_accepted = Counter("hallmark_speculative_accepted_tokens", "Draft tokens accepted.", registry=r)
        self.spec_acceptance = Gauge("hallmark_speculative_acceptance_rate",
                                     "Accepted / drafted tokens since start.", registry=r)
        self.watermark_unverified = Counter(
            "hallmark_watermark_unverified", "Remote outputs whose watermark did not verify before recording.",
            ["engine"], registry=r)
        self.receipts_unsigned = Counter("hallmark_receipts_unsigned",
                                         "Generations returned without a receipt (no signing key in the log).",
                                         registry=r)
        self.checkpoints_published = Counter("hallmark_log_checkpoints_published",
                                             "Transparency-log checkpoints this process published.", registry=r)
        self.witness_rounds = Counter("hallmark_log_witness_rounds",
                                      "Rounds asking the witnesses to cosign a checkpoint, by outcome (published: "
                                      "the quorum cosigned; short: it did not).", ["outcome"], registry=r)
        self.detections = Counter("hallmark_detections", "Detections by verdict.", ["verdict"], registry=r)
        self.rate_limited = Counter("hallmark_rate_limited", "Requests refused by the rate limit.", ["route"],
                                    registry=r)

    def record_generation(self, engine: str, done: Finished, watermarked: bool) -> None:
        self.generated_tokens.labels(engine).inc(len(done.token_ids))
        self.watermarked_tokens.labels(engine, "a").inc(done.routes.key_a)
        self.watermarked_tokens.labels(engine, "b").inc(done.routes.key_b)
        if watermarked:
            self.dedup_skips.inc(done.routes.plain)
        if done.token_ids:
            self.watermarked_share.observe(done.routes.watermarked / len(done.token_ids))
        if done.drafted_tokens:
            self.spec_drafted.inc(done.drafted_tokens)
            self.spec_accepted.inc(done.accepted_tokens)
            drafted = self.spec_drafted._value.get()  # noqa: SLF001 - counters expose no public read
            if drafted:
                self.spec_acceptance.set(self.spec_accepted._value.get() / drafted)  # noqa: SLF001

    def watch_engine(self, engine) -> None:
        """Export an engine's telemetry (``hallmark_engine_*``) if it keeps any; read at scrape
        time, so an engine that attaches its telemetry when it loads is seen once loaded."""
        from service.metrics_engine import EngineCollector

        if hasattr(engine, "telemetry"):
            self.registry.register(EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(CoarseDetections(self.registry))


DETECTION_ROUTES = ("/v1/detect", "/v1/public/detect")
DETECTION_STEP = 10
"""Detection counts are exported in whole tens, and detection latencies not at all: on a quiet
server, a scraper polling /metrics would otherwise see one check arrive, when, how long it
took (a long text) and its verdict."""


class CoarseDetections:
    """A registry's view for export: detection counters (by verdict, and the detection routes'
    request and rate-limit counts) floored to :data:`DETECTION_STEP`, the detection routes'
    latency histograms left out."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def restricted_registry(self, names):  # prometheus_client's listener asks for it with ?name[]=
        return self

    def collect(self):
        for family in self.registry.collect():
            if family.name in ("hallmark_detections", "hallmark_http_requests", "hallmark_rate_limited",
                               "hallmark_http_request_duration_seconds"):
                coarse = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    detection = family.name == "hallmark_detections" or sample.labels.get("route") in DETECTION_ROUTES
                    if not detection:
                        coarse.samples.append(sample)
                    elif family.name == "hallmark_http_request_duration_seconds":
                        continue
                    elif sample.name.endswith("_created"):
                        continue  # a creation time dates the first check
                    else:
                        coarse.samples.append(sample._replace(
                            value=math.floor(sample.value / DETECTION_STEP) * DETECTION_STEP))
                yield coarse
            else:
                yield family

