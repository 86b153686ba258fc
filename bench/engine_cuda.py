"""The local engine on one CUDA GPU with the Triton kernels (run on the H200).

    python bench/engine_cuda.py --out DIR [--model bundled --draft hallmark-tiny-draft]

Starts the engine (model load, kernel warm-up registry, engine warm-up), then serves a
mixed workload under Triton's compile watch: dual-key speculative requests, single-key
plain requests, a greedy and an unwatermarked one, batched together. Reports whether any
kernel compiled at request time, tokens/s, and the detection p-value of each watermarked
output under its key (and under a wrong key).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from detector.detect import detect  # noqa: E402
from detector.result import Candidate  # noqa: E402
from service.engines.base import Finished, GenerationRequest, WatermarkPlan  # noqa: E402
from service.engines.local.engine import LocalEngine  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

PROMPTS = ["The function returns", "Return a new list", "This module provides", "If the argument is"]


async def _generate(engine, requests):
    async def one(request):
        async for event in engine.generate(request):
            if isinstance(event, Finished):
                return event

    return await asyncio.gather(*(one(r) for r in requests))


async def main_async(args) -> dict:
    from watermark.kernels import registry

    engine = LocalEngine(args.model, args.draft, device="cuda", max_batch=16, speculative_k=4)
    start = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - start
    tok = engine.tokenizer()
    keys = [WatermarkKey(0xC0FFEE + i, WatermarkSpec(algorithm="dual_key_gumbel" if i % 2 == 0 else "gumbel"))
            for i in range(8)]
    requests = []
    for i, key in enumerate(keys):
        plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint)
        requests.append(GenerationRequest(f"r{i}", tuple(tok.encode(PROMPTS[i % 4])), args.tokens, seed=i,
                                          watermark=plan))
    requests.append(GenerationRequest("greedy", tuple(tok.encode(PROMPTS[0])), 32, temperature=0.0))
    requests.append(GenerationRequest("plain", tuple(tok.encode(PROMPTS[1])), 32, seed=99))
    before = registry.compiled_variants()
    with registry.CompileWatch() as watch:
        start = time.perf_counter()
        done = await _generate(engine, requests)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    after = registry.compiled_variants()
    await engine.stop()
    rows = []
    for key, out in zip(keys, done):
        own = detect(out.token_ids, [Candidate.inline(key)])
        wrong = detect(out.token_ids, [Candidate.inline(WatermarkKey(key.secret ^ 1, key.spec))])
        rows.append({"algorithm": key.spec.algorithm, "tokens": len(out.token_ids),
                     "routes": out.routes.__dict__, "drafted": out.drafted_tokens, "accepted": out.accepted_tokens,
                     "log10_p_own_key": own.log10_p_value, "log10_p_wrong_key": wrong.log10_p_value})
    total = sum(len(o.token_ids) for o in done)
    return {"device": torch.cuda.get_device_name(0), "startup_seconds": startup, "seconds": seconds,
            "tokens": total, "tokens_per_second": total / seconds, "compiled_at_request_time": watch.compiled,
            "compiled_variants_unchanged": before == after, "requests": rows,
            "command": "python bench/engine_cuda.py"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--draft", default="hallmark-tiny-draft")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "engine-cuda.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "requests"}, default=str))
    for row in result["requests"]:
        print(row)


if __name__ == "__main__":
    main()
