"""The local engine against vLLM's CPU build, side by side in one process's run, same model.

    python bench/local_vs_vllm_cpu.py [--batch 8] [--tokens 64] [--rounds 3] [--out FILE]

Model: the bundled draft (a dense Llama; vLLM's CPU build refuses sparse attention, so the
DeepSeek-V3.2-style target cannot run there). ``--batch`` concurrent requests of
``--tokens`` tokens, temperature 1, in alternating rounds (each run after ``--settle`` idle seconds): vLLM (``ignore_eos``), the
local engine unwatermarked, the local engine with a single-key watermark (the local engine
has no ignore-EOS switch: rates are tokens generated over wall time). Median of the rounds.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["The function returns", "Return a new list", "This module provides", "If the argument is"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--static-cache", action="store_true", help="the local engine over static KV caches")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of idle before each timed run")
    ap.add_argument("--local-threads", type=int, default=0,
                    help="intra-op threads of the local engine's thread (vLLM's workers are separate "
                         "processes with their own); 0 keeps the engine's choice (one for small models)")
    ap.add_argument("--out", default="bench/results/local-vs-vllm-cpu.json")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from service.engines.base import Finished, GenerationRequest, WatermarkPlan
    from service.engines.local.engine import LocalEngine
    from service.model_paths import BUNDLED_DRAFT, resolve_model_path
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    model = str(resolve_model_path(BUNDLED_DRAFT))
    llm = LLM(model=model, max_model_len=512, dtype="float32", enable_prefix_caching=False, disable_log_stats=True,
              seed=0)
    engine = LocalEngine(BUNDLED_DRAFT, None, device="cpu", max_batch=args.batch, static_cache=args.static_cache,
                         cpu_threads=args.local_threads or None)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    tok = engine.tokenizer()
    ids = [tok.encode(PROMPTS[i % 4]) for i in range(args.batch)]

    def run_vllm(r):
        params = [SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True, seed=100 * (r + 1) + i)
                  for i in range(args.batch)]
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - start)

    def run_local(r, watermark):
        reqs = []
        for i in range(args.batch):
            plan = None
            if watermark:
                key = WatermarkKey(77 + i, WatermarkSpec(algorithm="gumbel"))
                plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint)
            reqs.append(GenerationRequest(f"r{r}-{i}", tuple(ids[i]), args.tokens, seed=100 * (r + 1) + i, watermark=plan))

        async def go():
            async def one(req):
                async for event in engine.generate(req):
                    if isinstance(event, Finished):
                        return len(event.token_ids)
            return await asyncio.gather(*(one(q) for q in reqs))

        start = time.perf_counter()
        counts = loop.run_until_complete(go())
        return sum(counts) / (time.perf_counter() - start)

    run_vllm(-1), run_local(-1, False), run_local(-1, True)  # warm-up
    rates = {"vllm": [], "local_plain": [], "local_watermark": []}
    for r in range(args.rounds):
        order = [("vllm", lambda: run_vllm(r)), ("local_plain", lambda: run_local(r, False)),
                 ("local_watermark", lambda: run_local(r, True))]
        if r % 2:
            order.reverse()
        for name, fn in order:
            # Let the other engine's threads go idle first: right after a vLLM run the local
            # engine ran at half speed on this 2-core machine (vLLM's worker threads still
            # spinning); the pause is the same before every run, vLLM's included.
            time.sleep(args.settle)
            rates[name].append(fn())
    loop.run_until_complete(engine.stop())
    med = {k: statistics.median(v) for k, v in rates.items()}
    result = {"model": BUNDLED_DRAFT, "static_cache": args.static_cache, "local_threads": engine.cpu_threads, "batch": args.batch, "tokens": args.tokens, "rounds": rates,
              "tokens_per_s_median": med, "vllm_over_local_plain": med["vllm"] / med["local_plain"],
              "vllm_over_local_watermark": med["vllm"] / med["local_watermark"],
              "command": "python bench/local_vs_vllm_cpu.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
