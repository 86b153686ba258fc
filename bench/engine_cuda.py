"""The local engine on one CUDA GPU (run on the H200): static KV caches, CUDA-graph decode
and verify steps, Triton sampler kernels.

    python bench/engine_cuda.py --out FILE [--requests 16 --tokens 128 --rounds 2]

Starts the engine (model load, kernel warm-up registry, graph capture, engine warm-up),
runs one untimed warm-up batch, then in one process and alternating rounds: ``--requests``
concurrent ``--tokens``-token requests with the watermark on (dual key, speculative) and off
(no watermark, speculative: the same path minus the keyed sampling), and one request alone
(batch 1, ms per token). One more watermark-on batch runs under torch.profiler; the GPU
busy fraction is the union of GPU activity intervals (kernels, copies, sets) over that
batch's wall time. Reports request-time kernel compiles (Triton compile watch), engine
telemetry counters, and each watermarked output's detection p-value under its own key
and under a wrong key.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
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


def _batch(tok, n, tokens, watermark: bool, salt: int, algorithm: str = "dual_key_gumbel"):
    out, keys = [], []
    for i in range(n):
        key = WatermarkKey(0xC0FFEE + i, WatermarkSpec(algorithm=algorithm))
        plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint) if watermark else None
        keys.append(key if watermark else None)
        out.append(GenerationRequest(f"r{salt}-{i}", tuple(tok.encode(PROMPTS[i % 4])), tokens, seed=1000 * salt + i,
                                     watermark=plan))
    return out, keys


async def _timed(engine, requests):
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = await _generate(engine, requests)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(len(d.token_ids) for d in done)
    return done, tokens, seconds


def _busy_fraction(trace_path: str, wall_us: float) -> dict:
    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    gpu = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, end = 0.0, None
    first = gpu[0][0] if gpu else 0.0
    for s, e in gpu:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    syncs = sum(1 for e in events if e.get("cat") == "cuda_runtime" and "Synchronize" in e.get("name", ""))
    launches = sum(1 for e in events if e.get("cat") == "cuda_runtime" and e.get("name", "") in
                   ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"))
    graph_launches = sum(1 for e in events if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", ""))
    return {"gpu_busy_us": busy, "gpu_kernels": len(gpu), "first_gpu_event_us": first,
            "gpu_busy_fraction": busy / wall_us if wall_us else None, "stream_or_device_syncs": syncs,
            "eager_kernel_launches": launches, "graph_launches": graph_launches}


async def main_async(args) -> dict:
    from watermark.kernels import registry

    engine = LocalEngine(args.model, args.draft, device="cuda", max_batch=max(16, args.requests), speculative_k=4)
    start = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - start
    tok = engine.tokenizer()
    await _generate(engine, _batch(tok, args.requests, 32, True, 0)[0])  # untimed warm-up
    await _generate(engine, _batch(tok, args.requests, 32, False, 0)[0])
    before = registry.compiled_variants()
    rounds = {"on": [], "off": [], "batch1_ms_per_token": [], "single_key_plain": []}
    outputs = None
    with registry.CompileWatch() as watch:
        for r in range(args.rounds):
            reqs, keys = _batch(tok, args.requests, args.tokens, True, 10 + r)
            done, tokens, seconds = await _timed(engine, reqs)
            rounds["on"].append(tokens / seconds)
            outputs = (keys, done)
            reqs, _ = _batch(tok, args.requests, args.tokens, False, 20 + r)
            _, tokens, seconds = await _timed(engine, reqs)
            rounds["off"].append(tokens / seconds)
            reqs, _ = _batch(tok, args.requests, args.tokens, True, 30 + r, algorithm="gumbel")
            _, tokens, seconds = await _timed(engine, reqs)
            rounds["single_key_plain"].append(tokens / seconds)
            reqs, _ = _batch(tok, 1, args.tokens, True, 40 + r)
            _, tokens, seconds = await _timed(engine, reqs)
            rounds["batch1_ms_per_token"].append(1e3 * seconds / tokens)
    after = registry.compiled_variants()

    from torch.profiler import ProfilerActivity, profile

    reqs, _ = _batch(tok, args.requests, args.tokens, True, 50)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, p_tokens, p_seconds = await _timed(engine, reqs)
    trace = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(trace)
    busy = _busy_fraction(trace, p_seconds * 1e6)
    telemetry = engine.telemetry.snapshot()
    forwards = engine.telemetry.forward_counts()
    await engine.stop()

    keys, done = outputs
    rows = []
    for key, out in zip(keys, done):
        own = detect(out.token_ids, [Candidate.inline(key)])
        wrong = detect(out.token_ids, [Candidate.inline(WatermarkKey(key.secret ^ 1, key.spec))])
        rows.append({"tokens": len(out.token_ids), "drafted": out.drafted_tokens, "accepted": out.accepted_tokens,
                     "log10_p_own_key": own.log10_p_value, "log10_p_wrong_key": wrong.log10_p_value})
    on, off = statistics.median(rounds["on"]), statistics.median(rounds["off"])
    return {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "workload": f"{args.requests} concurrent requests x {args.tokens} tokens, bundled target + draft, k=4",
        "startup_seconds": round(startup, 2),
        "tokens_per_second_watermark_on": round(on, 1), "tokens_per_second_watermark_off": round(off, 1),
        "watermark_on_vs_off": round(on / off, 4),
        "tokens_per_second_single_key_plain_path": round(statistics.median(rounds["single_key_plain"]), 1),
        "batch1_ms_per_token": round(statistics.median(rounds["batch1_ms_per_token"]), 3),
        "rounds": rounds,
        "profiled_run": {"tokens": p_tokens, "seconds": round(p_seconds, 3),
                         "tokens_per_second_under_profiler": round(p_tokens / p_seconds, 1), **busy},
        "gpu_busy_fraction": busy["gpu_busy_fraction"],
        "compiled_at_request_time": watch.compiled, "compiled_variants_unchanged": before == after,
        "telemetry": telemetry, "forwards_replay_eager_compactions": forwards,
        "detection": rows,
        "command": "python bench/engine_cuda.py " + " ".join(sys.argv[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--draft", default="hallmark-tiny-draft")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="bench/results/engine-cuda-h200.json")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("detection", "rounds")}, default=str))


if __name__ == "__main__":
    main()
