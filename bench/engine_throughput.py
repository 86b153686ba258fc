"""Local engine throughput on this machine: tokens/s at batch 1 and 8, with and without
the watermark, with and without speculation; the watermark's share of decode time; and the
speculative acceptance rate with and without the watermark.

    .venv/bin/python -m bench.engine_throughput [--tokens 64] [--repeats 3]

Watermark cost: the engine's samplers are timed per step, together with a conventional
sampler on the same processed logits in the same run (softmax + torch.multinomial, the
baseline); cost = (watermark sampler time - baseline time) / decode time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from pathlib import Path

import torch

from service.engines.base import Finished, GenerationRequest, WatermarkPlan
from service.engines.local import runner, scheduler
from service.engines.local.engine import LocalEngine
from watermark import dispatch
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

PROMPTS = ["The function returns", "Return a new list", "This module provides", "The default value is",
           "If the argument is", "Raises an exception when", "The class implements", "Each element of the"]


class Timers:
    def __init__(self) -> None:
        self.forward = 0.0
        self.sampler = 0.0
        self.baseline = 0.0
        self.steps = 0


TIMERS = Timers()


def _instrument() -> None:
    forward = runner.Group.forward
    sample_rows = scheduler.sample_rows
    verify = dispatch.verify

    def timed_forward(self, *args, **kwargs):
        start = time.perf_counter()
        out = forward(self, *args, **kwargs)
        TIMERS.forward += time.perf_counter() - start
        TIMERS.steps += 1
        return out

    def timed_sample_rows(processed, rows, *args, **kwargs):
        start = time.perf_counter()
        out = sample_rows(processed, rows, *args, **kwargs)
        TIMERS.sampler += time.perf_counter() - start
        # The baseline: what a conventional sampler spends on the same processed logits.
        start = time.perf_counter()
        torch.multinomial(torch.softmax(processed, -1), 1)
        TIMERS.baseline += time.perf_counter() - start
        return out

    def timed_verify(target_probs, draft_probs, draft_tokens, rows, *args, **kwargs):
        start = time.perf_counter()
        out = verify(target_probs, draft_probs, draft_tokens, rows, *args, **kwargs)
        TIMERS.sampler += time.perf_counter() - start
        start = time.perf_counter()
        # Plain speculative verification: ratio test with torch uniforms + residual multinomial.
        b, k = draft_tokens.shape
        p_x = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        q_x = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        torch.rand(b, k) < p_x / q_x
        torch.multinomial(torch.clamp(target_probs[:, 0] - torch.cat([draft_probs, draft_probs[:, :1]], 1)[:, 0],
                                      min=1e-12), 1)
        TIMERS.baseline += time.perf_counter() - start
        return out

    runner.Group.forward = timed_forward
    scheduler.sample_rows = timed_sample_rows
    scheduler.dispatch.verify = timed_verify


def _plan(secret: int) -> WatermarkPlan:
    key = WatermarkKey(secret, WatermarkSpec(algorithm="dual_key_gumbel"))
    return WatermarkPlan(key=key, key_id="bench", version=1, fingerprint=key.fingerprint)


async def _run(engine: LocalEngine, batch: int, tokens: int, watermark: bool, seed: int):
    tok = engine.tokenizer()
    requests = [GenerationRequest(f"b{seed}-{i}", tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), tokens,
                                  seed=seed * 100 + i, watermark=_plan(0x1234_5678 + seed * 100 + i) if watermark
                                  else None) for i in range(batch)]

    async def one(request):
        async for event in engine.generate(request):
            if isinstance(event, Finished):
                return event

    start = time.perf_counter()
    done = await asyncio.gather(*(one(r) for r in requests))
    return time.perf_counter() - start, done


async def main_async(args) -> dict:
    results = []
    for speculate in (False, True):
        engine = LocalEngine(args.model, args.draft if speculate else None, device="cpu", max_batch=8,
                             speculative_k=args.k)
        await engine.start()
        for batch in (1, 8):
            for watermark in (False, True):
                TIMERS.__init__()
                times, generated, drafted, accepted = [], 0, 0, 0
                for repeat in range(args.repeats):
                    seconds, done = await _run(engine, batch, args.tokens, watermark, repeat)
                    times.append(seconds)
                    generated += sum(len(d.token_ids) for d in done)
                    drafted += sum(d.drafted_tokens for d in done)
                    accepted += sum(d.accepted_tokens for d in done)
                total = sum(times)
                decode = TIMERS.forward + TIMERS.sampler
                row = {"batch": batch, "speculative": speculate, "watermark": watermark,
                       "tokens_per_second": generated / total, "median_request_seconds": statistics.median(times),
                       "forward_seconds": TIMERS.forward, "sampler_seconds": TIMERS.sampler,
                       "baseline_sampler_seconds": TIMERS.baseline,
                       "watermark_cost_of_decode": (TIMERS.sampler - TIMERS.baseline) / decode if decode else None}
                if speculate:
                    row["acceptance_rate"] = accepted / drafted if drafted else None
                results.append(row)
                print(json.dumps(row))
        await engine.stop()
    # Acceptance with and without the watermark over many independent requests (one key and
    # seed each): a request's tokens are correlated, so requests are the sampling unit.
    engine = LocalEngine(args.model, args.draft, device="cpu", max_batch=8, speculative_k=args.k)
    await engine.start()
    rates = {True: [], False: []}
    for wave in range(args.acceptance_waves):
        for watermark in (True, False):
            _, done = await _run(engine, 8, args.tokens, watermark, 1000 + wave)
            rates[watermark].extend(d.accepted_tokens / d.drafted_tokens for d in done if d.drafted_tokens)
    await engine.stop()
    a, b = rates[True], rates[False]
    mean_a, mean_b = statistics.mean(a), statistics.mean(b)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    z = (mean_a - mean_b) / se if se else 0.0
    tests = {"requests_each": len(a), "with_watermark": mean_a, "without": mean_b, "standard_error": se,
             "z": z, "two_sided_p": math.erfc(abs(z) / math.sqrt(2))}
    return {"rows": results, "acceptance_with_vs_without_watermark": tests, "tokens_per_request": args.tokens,
            "repeats": args.repeats, "k": args.k, "threads": engine.cpu_threads,  # the engine thread's
            "command": "python -m bench.engine_throughput"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--draft", default="hallmark-tiny-draft")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--acceptance-waves", type=int, default=6, help="8 requests per wave and mode")
    parser.add_argument("--out", default="bench/results/engine_throughput.json")
    args = parser.parse_args()
    _instrument()
    result = asyncio.run(main_async(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'batch':>5} {'spec':>5} {'wm':>5} {'tok/s':>8} {'wm cost':>8} {'accept':>7}")
    for r in result["rows"]:
        cost = r["watermark_cost_of_decode"]
        print(f"{r['batch']:5d} {str(r['speculative']):>5} {str(r['watermark']):>5} {r['tokens_per_second']:8.1f} "
              f"{(cost * 100 if cost is not None else float('nan')):7.2f}% {r.get('acceptance_rate') or float('nan'):7.3f}")
    t = result["acceptance_with_vs_without_watermark"]
    print(f"acceptance over {t['requests_each']} requests each: {t['with_watermark']:.3f} with vs "
          f"{t['without']:.3f} without the watermark (SE {t['standard_error']:.3f}, p = {t['two_sided_p']:.2f})")


if __name__ == "__main__":
    main()
