"""Cost of the engine telemetry (service/engines/local/telemetry.py).

    python bench/engine_telemetry.py [--device cpu] [--requests 8] [--tokens 48] [--out FILE]

Runs the local engine (bundled target + draft, speculative, dual key) on a batch of
concurrent requests and times, inside the same run: the step hook per step (wrapped with
perf_counter around the registered hook), the whole step (between hook calls), and one
/metrics render (which reads the groups' masks). Reports the hook's share of step time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.engines.base import Finished, GenerationRequest, WatermarkPlan  # noqa: E402
from service.engines.local.engine import LocalEngine  # noqa: E402
from service.metrics import Metrics  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    engine = LocalEngine("bundled", "hallmark-tiny-draft", device=args.device, max_batch=16, speculative_k=4)
    metrics = Metrics()
    metrics.watch_engine(engine)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    hook = engine.telemetry.on_step
    hook_s: list[float] = []
    marks: list[float] = []

    def timed(report):
        t0 = time.perf_counter()
        hook(report)
        t1 = time.perf_counter()
        hook_s.append(t1 - t0)
        marks.append(t1)

    engine.step_hooks[engine.step_hooks.index(hook)] = timed
    tok = engine.tokenizer()
    requests = []
    for i in range(args.requests):
        key = WatermarkKey(0xBEEF + i, WatermarkSpec(algorithm="dual_key_gumbel"))
        plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint)
        prompt = tuple(tok.encode("Return a new list of the items. " * (1 + 4 * (i % 3))))
        requests.append(GenerationRequest(f"r{i}", prompt, args.tokens, seed=i, watermark=plan))

    async def run():
        async def one(r):
            async for event in engine.generate(r):
                if isinstance(event, Finished):
                    return event
        return await asyncio.gather(*(one(r) for r in requests))

    start = time.perf_counter()
    done = loop.run_until_complete(run())
    wall = time.perf_counter() - start
    render_s = []
    for _ in range(20):
        t0 = time.perf_counter()
        metrics.render()
        render_s.append(time.perf_counter() - t0)
    loop.run_until_complete(engine.stop())
    loop.close()

    steps = [b - a for a, b in zip(marks, marks[1:])]
    hook_sorted, step_sorted = sorted(hook_s), sorted(steps)
    result = {
        "device": args.device, "requests": args.requests, "tokens_per_request": args.tokens,
        "tokens": sum(len(d.token_ids) for d in done), "wall_s": round(wall, 3), "steps": len(hook_s),
        "hook_us_median": round(hook_sorted[len(hook_sorted) // 2] * 1e6, 2),
        "hook_us_max": round(hook_sorted[-1] * 1e6, 2),
        "step_ms_median": round(step_sorted[len(step_sorted) // 2] * 1e3, 3) if steps else None,
        "hook_share_of_step_time": round(sum(hook_s) / sum(steps), 6) if steps else None,
        "metrics_render_ms_median": round(sorted(render_s)[10] * 1e3, 3),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
