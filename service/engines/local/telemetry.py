"""Engine telemetry: what the local engine's KV caches, sparse attention, speculation and
forward passes are doing, collected through the engine's step hooks (the model code is not
touched) and exported at ``/metrics`` by ``service.metrics_engine``.

Cost model: the step hook does host-side arithmetic only (no device synchronisation, no
tensor reads): request lengths come from the request states, forward counts from the
groups' own counters. Quantities that need a tensor read (live KV tokens per group) are
computed when ``/metrics`` is scraped, on the scraping thread, from the groups' current
masks (tensors are replaced, never written in place, so a reference is a consistent copy).
``bench/engine_telemetry.py`` measures the hook's cost per step.

Sparse attention (DeepSeek-V3.2): the lightning indexer selects ``index_topk`` keys per
query; a query whose context holds at most ``index_topk`` keys attends to all of them, so
it is counted as dense, one with more as sparse. Context lengths are each request's prompt
plus output (host-side), so a speculative block's queries are counted at the block's
starting length plus their offset.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# Upper bounds of the speculative-blocks-per-step histogram (one block per speculative row).
BLOCK_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class StepReport:
    """What one engine step ran: per row of the plain group and of the speculative group,
    prompt + output tokens before the step (= the keys its first query attends to, itself
    included), as int arrays [B] (or sequences), and the speculative block size k."""

    plain_lengths: Sequence[int]
    speculative_lengths: Sequence[int]
    k: int


@dataclass
class GroupSample:
    """One batch group's cache at scrape time."""

    name: str
    in_use: int  # live KV columns summed over rows
    capacity: int  # allocated columns x rows
    indexer_layers: int  # layers that cache indexer keys


@dataclass
class EngineTelemetry:
    """Counters kept by the step hook; read (under the lock) by the /metrics collector."""

    index_topk: int | None  # the target model's indexer top-k; None for dense models
    groups: dict = field(default_factory=dict)  # name -> Group (read at scrape time)
    steps: int = 0
    sparse_queries: int = 0
    dense_queries: int = 0
    block_counts: list[int] = field(default_factory=lambda: [0] * (len(BLOCK_BUCKETS) + 1))
    blocks_total: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def attach(cls, engine) -> EngineTelemetry:
        """Create the telemetry of a loaded ``LocalEngine`` and register its step hook."""
        topk = getattr(engine.plain.model.config, "index_topk", None)
        telemetry = cls(index_topk=int(topk) if topk else None)
        telemetry.groups = {"plain": engine.plain, "speculative_target": engine.spec_target}
        if engine.spec is not None:
            telemetry.groups["speculative_draft"] = engine.spec.draft
        engine.step_hooks.append(telemetry.on_step)
        return telemetry

    def on_step(self, report: StepReport) -> None:
        """The step hook: host-side counting only, with array operations (no loop over rows)."""
        sparse = dense = 0
        topk = self.index_topk
        plain = np.asarray(report.plain_lengths, dtype=np.int64)
        spec = np.asarray(report.speculative_lengths, dtype=np.int64)
        if topk is not None:
            # a plain row's one query attends to `length` keys
            sparse = int((plain > topk).sum())
            dense = len(plain) - sparse
            # the target verifies the pending token and k drafts: query j (0..k) attends to
            # length + j keys; those above topk are sparse
            span = report.k + 1
            n_sparse = int(np.clip(spec + report.k - topk, 0, span).sum())
            sparse += n_sparse
            dense += span * len(spec) - n_sparse
        blocks = len(spec)
        bucket = next((i for i, bound in enumerate(BLOCK_BUCKETS) if blocks <= bound), len(BLOCK_BUCKETS))
        with self._lock:
            self.steps += 1
            self.sparse_queries += sparse
            self.dense_queries += dense
            self.block_counts[bucket] += 1
            self.blocks_total += blocks

    def snapshot(self) -> dict:
        """Counters (consistent with each other) for the collector."""
        with self._lock:
            return {"steps": self.steps, "sparse_queries": self.sparse_queries,
                    "dense_queries": self.dense_queries, "block_counts": list(self.block_counts),
                    "blocks_total": self.blocks_total}

    def sample_groups(self) -> list[GroupSample]:
        """Read each group's cache occupancy now (one small reduction per group)."""
        return [GroupSample(name, *group.occupancy()) for name, group in self.groups.items()]

    def forward_counts(self) -> dict[str, tuple[int, int, int]]:
        """name -> (graph replays, eager forwards, hole compactions)."""
        return {name: (g.graph_replays, g.eager_forwards, g.compactions) for name, g in self.groups.items()}
