"""The local engine on one CUDA GPU (run on the H200): static KV caches, speculative blocks
replayed as CUDA graphs, Triton sampler kernels.

    python bench/engine_cuda.py --out FILE [--requests 16 --tokens 128 --rounds 16 --trace-dir DIR]

Starts the engine (model load, kernel warm-up registry, graph capture, engine warm-up),
runs two untimed warm-up batches of each mode, then ``--rounds`` rounds, each one timed
batch of ``--requests`` concurrent ``--tokens``-token requests with the watermark on (dual
key, speculative) and one with it off (no watermark, speculative: the same path minus the
keyed sampling), in alternating order (on, off / off, on). The unit of work is the issue's
workload (16 concurrent 128-token requests, ~0.4 s); the figures are the medians over the
rounds with quartiles, min and max, and on vs off is each round's ratio (its median and
spread), so a difference of a few percent is resolved against the rounds' own scatter.
By default EOS is ignored (as vLLM's benchmarks' ``ignore_eos``): every request generates
exactly ``--tokens`` tokens, so both modes do the same work per round (with EOS, a few
requests that stop early change tokens per step by more than the difference measured).
Per round: engine steps, ms per step and tokens per step (speculative acceptance), which
separate a slower step from fewer accepted drafts. Then ``--small-rounds`` of one request
alone (batch 1, ms per token) and of single-key requests (plain path).

One more batch of each mode runs under torch.profiler; the GPU busy fraction is the union
of GPU activity intervals (kernels, copies, sets) over that batch's wall time;
``--trace-dir`` keeps the watermark-on batch's trace (gzip). ``--long-tokens`` checks that a
long request's tokens are the same alone and beside a long-prompt request (which moves the
batch's column window earlier). Reports request-time
kernel compiles (Triton compile watch), engine telemetry counters, graph replays vs eager
blocks, and each watermarked output's detection p-value under its own key and a wrong key.
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


def _spread(values: list[float]) -> dict:
    """Median, quartiles, min and max of a list of per-round figures."""
    values = sorted(values)
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {"median": round(statistics.median(values), 4), "q1": round(q[0], 4), "q3": round(q[2], 4),
            "min": round(values[0], 4), "max": round(values[-1], 4), "n": len(values)}


async def _round(engine, requests):
    """One timed batch: tokens/s, and the engine steps it took (speculative blocks)."""
    steps = engine.telemetry.snapshot()["steps"]
    done, tokens, seconds = await _timed(engine, requests)
    steps = engine.telemetry.snapshot()["steps"] - steps
    return done, {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds, "steps": steps,
                  "ms_per_step": 1e3 * seconds / max(steps, 1), "tokens_per_step": tokens / max(steps, 1)}


def _profile(engine, tok, args, watermark: bool, salt: int, trace_dir: str | None):
    from torch.profiler import ProfilerActivity, profile

    async def go():
        reqs, _ = _batch(tok, args.requests, args.tokens, watermark, salt)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _, tokens, seconds = await _timed(engine, reqs)
        return prof, tokens, seconds

    return go()


async def main_async(args) -> dict:
    from watermark.kernels import registry

    engine = LocalEngine(args.model, args.draft, device="cuda", max_batch=max(16, args.requests), speculative_k=4,
                         pipeline_blocks=not args.no_pipeline)
    start = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - start
    if args.ignore_eos:  # every request generates exactly --tokens tokens (vLLM's benchmarks: ignore_eos)
        engine.eos_ids = frozenset()
    tok = engine.tokenizer()
    for salt in (0, 1):  # untimed warm-up
        await _generate(engine, _batch(tok, args.requests, args.tokens, True, salt)[0])
        await _generate(engine, _batch(tok, args.requests, args.tokens, False, salt)[0])
    before = registry.compiled_variants()
    counts = engine._blocks.counts if engine._blocks is not None else None  # noqa: SLF001
    counts_before = dict(vars(counts)) if counts is not None else None
    rounds = {"on": [], "off": [], "batch1_ms_per_token": [], "single_key_plain": []}
    outputs = None
    with registry.CompileWatch() as watch:
        for r in range(args.rounds):
            # Alternating order (on, off / off, on): a drift in the machine's speed over the
            # run weighs on both modes alike.
            for watermark in ((True, False) if r % 2 == 0 else (False, True)):
                reqs, keys = _batch(tok, args.requests, args.tokens, watermark, (10 if watermark else 20) + r)
                done, stats = await _round(engine, reqs)
                rounds["on" if watermark else "off"].append(stats)
                if watermark:
                    outputs = (keys, done)
        for r in range(args.small_rounds):
            reqs, _ = _batch(tok, args.requests, args.tokens, True, 30 + r, algorithm="gumbel")
            _, tokens, seconds = await _timed(engine, reqs)
            rounds["single_key_plain"].append(tokens / seconds)
            reqs, _ = _batch(tok, 1, args.tokens, True, 40 + r)
            _, tokens, seconds = await _timed(engine, reqs)
            rounds["batch1_ms_per_token"].append(1e3 * seconds / tokens)
    after = registry.compiled_variants()
    host_ms_per_block = None
    if counts is not None:  # the timed rounds' blocks (on, off, single-key plain, batch 1): host ms per phase
        diff = {k: v - counts_before[k] for k, v in vars(counts).items()}
        n = max(1, diff["graph_replays"] + diff["eager_blocks"])
        host_ms_per_block = {"blocks": n, **{k.removeprefix("seconds_"): round(1e3 * v / n, 4)
                                             for k, v in diff.items() if k.startswith("seconds_")}}

    # Pipelined vs not, side by side in this run: alternating rounds (watermark on), the
    # engine's blocks switched between rounds (nothing is in flight then).
    pipeline_ab = None
    if args.pipeline_ab and engine._blocks is not None:  # noqa: SLF001
        blocks = engine._blocks  # noqa: SLF001
        ab = {True: [], False: []}
        for r in range(args.pipeline_ab):
            for mode in ((True, False) if r % 2 == 0 else (False, True)):
                blocks.pipeline = mode
                reqs, _ = _batch(tok, args.requests, args.tokens, True, 70 + r)
                _, stats = await _round(engine, reqs)
                ab[mode].append(stats)
        blocks.pipeline = not args.no_pipeline
        tps = {m: [s["tokens_per_second"] for s in v] for m, v in ab.items()}
        pipeline_ab = {"rounds_each": args.pipeline_ab, "tokens_per_second_pipelined": _spread(tps[True]),
                       "tokens_per_second_not_pipelined": _spread(tps[False]),
                       "pipelined_vs_not_per_round": _spread([a / b for a, b in zip(tps[True], tps[False])]),
                       "ms_per_step_pipelined": _spread([s["ms_per_step"] for s in ab[True]]),
                       "ms_per_step_not_pipelined": _spread([s["ms_per_step"] for s in ab[False]])}

    # bf16 batch independence over long outputs: one request alone, then beside a request
    # whose long prompt moves the batch's column window (static_runner.WINDOWS) earlier.
    long_check = None
    if args.long_tokens:
        reqs, _ = _batch(tok, 1, args.long_tokens, True, 60)
        alone = (await _generate(engine, reqs))[0].token_ids
        other = GenerationRequest("long-prompt", tuple(tok.encode("The function returns a list. " * 60))[:400],
                                  args.long_tokens, seed=7)
        together = (await _generate(engine, reqs + [other]))[0].token_ids
        first = next((i for i, (a, b) in enumerate(zip(alone, together)) if a != b), None)
        long_check = {"tokens": len(alone), "other_prompt_tokens": len(other.prompt_ids),
                      "equal": alone == together, "first_difference": first}

    profiles = {}
    runs = [("on", True, 50), ("off", False, 51)]
    if args.pipeline_ab and engine._blocks is not None:  # noqa: SLF001
        runs.append(("on_not_pipelined", True, 52))
    for name, watermark, salt in runs:
        if name == "on_not_pipelined":
            engine._blocks.pipeline = False  # noqa: SLF001
        prof, p_tokens, p_seconds = await _profile(engine, tok, args, watermark, salt, args.trace_dir)
        if name == "on_not_pipelined":
            engine._blocks.pipeline = not args.no_pipeline  # noqa: SLF001
        trace = tempfile.mktemp(suffix=".json")
        prof.export_chrome_trace(trace)
        busy = _busy_fraction(trace, p_seconds * 1e6)
        profiles[name] = {"tokens": p_tokens, "seconds": round(p_seconds, 3),
                          "tokens_per_second_under_profiler": round(p_tokens / p_seconds, 1), **busy}
        if args.trace_dir and name == "on":  # the watermark-on batch's trace (gzip; read it with _busy_fraction)
            Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
            import gzip
            import shutil

            with open(trace, "rb") as src, gzip.open(Path(args.trace_dir) / f"engine-cuda-trace-{name}.json.gz",
                                                    "wb", compresslevel=3) as dst:
                shutil.copyfileobj(src, dst)
        Path(trace).unlink()
    telemetry = engine.telemetry.snapshot()
    forwards = engine.telemetry.forward_counts()
    blocks = vars(engine._blocks.counts) if engine._blocks is not None else None  # noqa: SLF001
    await engine.stop()

    keys, done = outputs
    rows = []
    for key, out in zip(keys, done):
        own = detect(out.token_ids, [Candidate.inline(key)])
        wrong = detect(out.token_ids, [Candidate.inline(WatermarkKey(key.secret ^ 1, key.spec))])
        rows.append({"tokens": len(out.token_ids), "drafted": out.drafted_tokens, "accepted": out.accepted_tokens,
                     "log10_p_own_key": own.log10_p_value, "log10_p_wrong_key": wrong.log10_p_value})
    on = [s["tokens_per_second"] for s in rounds["on"]]
    off = [s["tokens_per_second"] for s in rounds["off"]]
    ratios = [a / b for a, b in zip(on, off)]  # each round's on against its own round's off
    step_ratios = [b["ms_per_step"] / a["ms_per_step"] for a, b in zip(rounds["on"], rounds["off"])]
    summary = {
        "tokens_per_second_on": _spread(on), "tokens_per_second_off": _spread(off),
        "on_vs_off_per_round": _spread(ratios),
        "ms_per_step_on": _spread([s["ms_per_step"] for s in rounds["on"]]),
        "ms_per_step_off": _spread([s["ms_per_step"] for s in rounds["off"]]),
        "step_time_off_vs_on_per_round": _spread(step_ratios),
        "tokens_per_step_on": _spread([s["tokens_per_step"] for s in rounds["on"]]),
        "tokens_per_step_off": _spread([s["tokens_per_step"] for s in rounds["off"]]),
        "timed_seconds_total": round(sum(s["seconds"] for s in rounds["on"] + rounds["off"]), 2),
    }
    return {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "pipeline_blocks": not args.no_pipeline,
        "workload": f"{args.requests} concurrent requests x {args.tokens} tokens, bundled target + draft, k=4"
                    + (", EOS ignored (every request generates exactly that many tokens)" if args.ignore_eos else ""),
        "rounds_each": args.rounds,
        "startup_seconds": round(startup, 2),
        "tokens_per_second_watermark_on": round(statistics.median(on), 1),
        "tokens_per_second_watermark_off": round(statistics.median(off), 1),
        "watermark_on_vs_off": round(statistics.median(ratios), 4),
        "summary": summary,
        "tokens_per_second_single_key_plain_path": round(statistics.median(rounds["single_key_plain"]), 1),
        "batch1_ms_per_token": round(statistics.median(rounds["batch1_ms_per_token"]), 3),
        "rounds": rounds,
        "profiled_run": profiles["on"],
        "profiled_run_off": profiles["off"],
        "gpu_busy_fraction": profiles["on"]["gpu_busy_fraction"],
        "profiled_run_on_not_pipelined": profiles.get("on_not_pipelined"),
        "pipeline_ab": pipeline_ab,
        "compiled_at_request_time": watch.compiled, "compiled_variants_unchanged": before == after,
        "telemetry": telemetry, "forwards_replay_eager_compactions": forwards,
        "speculative_blocks": blocks,
        "host_ms_per_block_timed_rounds": host_ms_per_block,
        "long_output_batch_independence": long_check,
        "detection": rows,
        "command": "python bench/engine_cuda.py " + " ".join(sys.argv[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--draft", default="hallmark-tiny-draft")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=16, help="timed rounds of each mode (on and off)")
    parser.add_argument("--small-rounds", type=int, default=5, help="rounds of batch 1 and single-key plain")
    parser.add_argument("--keep-eos", dest="ignore_eos", action="store_false",
                        help="stop requests at EOS (default: ignore EOS, every request runs --tokens tokens)")
    parser.add_argument("--long-tokens", type=int, default=600,
                        help="tokens of the long-output batch-independence check (0: skip)")
    parser.add_argument("--no-pipeline", action="store_true",
                        help="take each speculative block before launching the next (no chained launches)")
    parser.add_argument("--pipeline-ab", type=int, default=0,
                        help="rounds of each: pipelined vs not (watermark on, alternating), and one more profile")
    parser.add_argument("--trace-dir", default=None, help="write the profiled batches' traces and tables here")
    parser.add_argument("--out", default="bench/results/engine-cuda-h200.json")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("detection", "rounds", "summary")}, default=str))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
