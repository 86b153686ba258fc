"""The local engine on the CPU with 256-bit dual keys, speculating (issue 36) against 64-bit dual
keys speculating and against 256-bit dual keys decoding one token a step (what they did before):
tokens/s and acceptance, one run, the same prompts and seeds.

    .venv/bin/python -m bench.wide_speculation_cpu [--requests 8] [--tokens 64] [--out FILE]

The box is shared: the three modes run interleaved, round by round, and the medians are given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from service.engines.base import GenerationRequest, WatermarkPlan, finish_all
from service.engines.local.engine import LocalEngine
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

PROMPTS = ("The function returns", "Return a new list", "This module provides", "The default value is",
           "If the argument is", "Raises an exception when", "The class implements", "Each element of the")
MODES = {"philox_dual_spec": ("philox4x32-10-v1", True), "hmac_dual_spec": ("hmac-sha256-philox-v1", True),
         "hmac_dual_no_draft": ("hmac-sha256-philox-v1", False)}


def _requests(tok, prf: str, n: int, tokens: int, round_: int) -> list[GenerationRequest]:
    out = []
    for i in range(n):
        secret = (2**255 if prf.startswith("hmac") else 2**63) + 1000 * round_ + i
        key = WatermarkKey(secret, WatermarkSpec(algorithm="dual_key_gumbel", prf=prf))
        plan = WatermarkPlan(key=key, key_id=f"b{i}", version=1, fingerprint=key.fingerprint)
        out.append(GenerationRequest(f"r{round_}-{i}", tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), tokens,
                                     seed=round_ * 100 + i, watermark=plan))
    return out


async def _run(args) -> dict:
    engines = {}
    for name, (_, speculate) in MODES.items():
        engine = LocalEngine("bundled", "hallmark-tiny-draft" if speculate else None, device="cpu",
                             max_batch=args.requests, speculative_k=args.k)
        await engine.start()
        engines[name] = engine
    seconds = {name: [] for name in MODES}
    produced = {name: 0 for name in MODES}
    drafted = {name: 0 for name in MODES}
    accepted = {name: 0 for name in MODES}
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up
            for name, (prf, _) in MODES.items():
                engine = engines[name]
                requests = _requests(engine.tokenizer(), prf, args.requests, args.tokens, round_)
                start = time.perf_counter()
                done = await finish_all(engine, requests)
                elapsed = time.perf_counter() - start
                if round_ == 0:
                    continue
                seconds[name].append(elapsed)
                produced[name] += sum(len(f.token_ids) for f in done)
                drafted[name] += sum(f.drafted_tokens for f in done)
                accepted[name] += sum(f.accepted_tokens for f in done)
    finally:
        for engine in engines.values():
            await engine.stop()
    rows = {}
    for name in MODES:
        median = statistics.median(seconds[name])
        rows[name] = {"median_s": median, "min_s": min(seconds[name]),
                      "tokens_per_s": produced[name] / args.rounds / median,
                      "acceptance": accepted[name] / drafted[name] if drafted[name] else None}
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/wide-speculation-cpu.json"))
    args = parser.parse_args()
    rows = asyncio.run(_run(args))
    out = {"command": "python -m bench.wide_speculation_cpu " + " ".join(sys.argv[1:]), "requests": args.requests,
           "tokens": args.tokens, "k": args.k, "rounds": args.rounds, "load_average": os.getloadavg(),
           "note": "shared 2-core box: modes interleaved round by round; medians", "modes": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
