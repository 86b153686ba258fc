"""Where admission's time goes when N requests arrive at once (one round of engine_cuda.py).

    python bench/engine_admission.py [--requests 256] [--tokens 8] [--rounds 3] [--device cpu]
        [--gpu-path] [--out FILE]

Per round: N concurrent ``LocalEngine.generate`` calls (bundled target + draft, dual key,
k = 4, EOS ignored), as bench/engine_cuda.py submits them. Reported per round: how many
admissions (``_admit_all`` calls) the N requests took and their sizes, the host seconds in
admission, and that time by stage (wrappers around the functions admission calls: draining
the blocks in flight, the prefills, the first draw, the groups' joins, the GPU deduper's
slots, the RowTables built at the next steps). On the CPU the prefills are real forwards;
the rest is the host's share, which is what the GPU run's 0.1-0.3 s per round is made of.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rows import emit  # noqa: E402

PROMPTS = ["The function returns", "Return a new list", "This module provides", "If the argument is"]


class Stages:
    """Seconds per wrapped function, and admission calls' sizes."""

    def __init__(self) -> None:
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.sizes: list[int] = []

    def wrap(self, owner, name: str, label: str | None = None) -> None:
        original = getattr(owner, name)
        label = label or name

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t
                self.calls[label] += 1

        setattr(owner, name, timed)

    def take(self) -> dict:
        out = {"admissions": self.calls["admit_all"], "sizes": sorted(self.sizes, reverse=True)[:12],
               "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
               "calls": dict(self.calls)}
        self.seconds.clear()
        self.calls.clear()
        self.sizes.clear()
        return out


async def run(args) -> list[dict]:
    from service.engines import base
    from service.engines.local import batch, engine as engine_module, rows, static_runner
    from service.engines.local.engine import LocalEngine
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    stages = Stages()
    cls = engine_module.LocalEngine
    original_admit_all = cls._admit_all

    def admit_all(engine, states):
        stages.sizes.append(len(states))
        return original_admit_all(engine, states)

    cls._admit_all = admit_all
    stages.wrap(cls, "_admit_all", "admit_all")
    stages.wrap(cls, "_drain_blocks", "drain_blocks")
    stages.wrap(cls, "_snapshot", "snapshot")
    stages.wrap(batch, "prefill_all")
    stages.wrap(batch, "sample_next", "first_draw")
    stages.wrap(rows.RowTable, "build", "rowtable_build")
    stages.wrap(rows.DedupSlots, "open", "dedup_open")
    if hasattr(rows.DedupSlots, "open_many"):
        stages.wrap(rows.DedupSlots, "open_many", "dedup_open")
    for group in (static_runner.StaticGroup, __import__("service.engines.local.runner", fromlist=["Group"]).Group):
        stages.wrap(group, "join_many", "join_many")

    # --gpu-path: the CUDA engine's structures on this device (static caches, speculative
    # blocks, the streamer's thread), as the CPU parity test runs them
    path = dict(static_cache=True, speculative_blocks=True, streamer_thread=True) if args.gpu_path else {}
    engine = LocalEngine("bundled", "hallmark-tiny-draft", device=args.device, max_batch=args.requests, speculative_k=4,
                         max_queue=max(256, args.requests), **path)
    await engine.start()
    tok = engine.tokenizer()
    engine.eos_ids = frozenset()  # every request generates exactly --tokens
    out = []
    try:
        for r in range(args.rounds + 1):
            requests = []
            for i in range(args.requests):
                key = WatermarkKey(0xC0FFEE + i, WatermarkSpec(algorithm="dual_key_gumbel"))
                plan = base.WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint)
                requests.append(base.GenerationRequest(f"r{r}-{i}", tuple(tok.encode(PROMPTS[i % 4])), args.tokens,
                                                       seed=1000 * r + i, watermark=plan))
            stages.take()

            async def one(request):
                async for event in engine.generate(request):
                    if isinstance(event, base.Finished):
                        return event

            start = time.perf_counter()
            done = await asyncio.gather(*(one(q) for q in requests))
            seconds = time.perf_counter() - start
            row = {"round": r, "requests": args.requests, "tokens": sum(len(d.token_ids) for d in done),
                   "seconds": round(seconds, 3), **stages.take()}
            if r:  # the first round warms up
                out.append(row)
            print(row, flush=True)
    finally:
        await engine.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpu-path", action="store_true",
                        help="static caches, speculative blocks and the streamer's thread (the CUDA engine's path)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows_ = asyncio.run(run(args))
    admission = [r["seconds"].get("admit_all", 0.0) for r in rows_]
    emit({"bench": "engine_admission", "device": args.device, "gpu_path": args.gpu_path, "requests": args.requests, "tokens": args.tokens,
          "rounds": rows_, "admission_s_median": round(statistics.median(admission), 4),
          "admissions_median": statistics.median(r["admissions"] for r in rows_),
          "command": "python bench/engine_admission.py " + " ".join(sys.argv[1:])}, args.out)


if __name__ == "__main__":
    main()
