"""Where the local engine's time goes on one GPU, for any tree (this one or another).

    python bench/engine_profile.py --tree PATH --requests 16,64,256 --rounds 4 --out FILE.json \
        [--parity-out FILE.json] [--profile-at 256]

``--tree`` is put first on ``sys.path`` before the engine is imported, so one copy of this
script measures the tree under test and a baseline checkout alike. Per concurrency N
(N requests x ``--tokens`` tokens, EOS ignored, dual key on / no watermark off, alternating
rounds), besides tokens/s:

* **GPU time per block and the GPU's idle time between blocks**: CUDA events recorded
  around every graph-replayed speculative block (the events cost a few microseconds; no
  profiler), so a round's wall time splits into GPU busy in blocks, GPU idle between
  blocks (host-bound gaps, prefills) and the rest;
* **admission**: host seconds spent admitting requests (prefill, first draw, join);
* the engine's own host phase counters (``SpeculativeBlocks.counts``), per block.

At ``--profile-at`` N: one watermark-on round under torch.profiler (GPU kernels grouped by
name: where a block's GPU time goes) and one round under a stack sampler (every thread's
Python stack every ~0.5 ms: where the host's time goes, per thread). Then the GPU time of
one prefill (target and draft, 16-token prompt) and batch-1 latency. ``--parity-out``
records the fixed request set's outputs first (tests/service/engines/local/parity.py).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path


def _args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--requests", default="16,64,256")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--profile-at", type=int, default=256)
    parser.add_argument("--parity-out", default=None)
    parser.add_argument("--parity-tokens", type=int, default=96)
    parser.add_argument("--parity-extra", type=int, default=48)
    parser.add_argument("--switch-ab", type=int, default=0,
                        help="rounds of each at the largest size: the interpreter's default switch interval vs 0.5 ms")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (no GPU timings)")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


ARGS = _args()
sys.path.insert(0, str(Path(ARGS.tree).resolve()))

import torch  # noqa: E402

from service.engines.base import Finished, GenerationRequest, WatermarkPlan  # noqa: E402
from service.engines.local import engine as engine_module  # noqa: E402
from service.engines.local import spec_block  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

CUDA = ARGS.device == "cuda"


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


PROMPTS = ["The function returns", "Return a new list", "This module provides", "If the argument is"]


class BlockEvents:
    """CUDA events around each graph-replayed block (monkeypatched onto SpeculativeBlocks)."""

    def __init__(self) -> None:
        self.events: list[tuple[int, object, object]] = []
        self.on = False
        original = spec_block.SpeculativeBlocks._launch  # noqa: SLF001

        def launch(blocks, captured, rows, *args, **kwargs):
            if not (self.on and CUDA):
                return original(blocks, captured, rows, *args, **kwargs)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = original(blocks, captured, rows, *args, **kwargs)
            end.record()
            self.events.append((len(rows), start, end))
            return out

        spec_block.SpeculativeBlocks._launch = launch  # noqa: SLF001

    def take(self) -> dict:
        _sync()
        events, self.events = self.events, []
        if not events:
            return {}
        spans = [s.elapsed_time(e) for _, s, e in events]
        gaps = [max(0.0, events[i][2].elapsed_time(events[i + 1][1])) for i in range(len(events) - 1)]
        return {"blocks": len(events), "gpu_ms_per_block": round(statistics.median(spans), 4),
                "gpu_ms_in_blocks": round(sum(spans), 2), "gpu_idle_ms_between_blocks": round(sum(gaps), 2),
                "gap_ms_median": round(statistics.median(gaps), 4) if gaps else None,
                "first_to_last_ms": round(events[0][1].elapsed_time(events[-1][2]), 2)}


class Admission:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0
        original = engine_module.LocalEngine._admit_contained  # noqa: SLF001

        def admit(engine, state):
            t = time.perf_counter()
            try:
                return original(engine, state)
            finally:
                self.seconds += time.perf_counter() - t
                self.count += 1

        engine_module.LocalEngine._admit_contained = admit  # noqa: SLF001

    def take(self) -> dict:
        out = {"admitted": self.count, "admission_s": round(self.seconds, 4)}
        self.seconds, self.count = 0.0, 0
        return out


class StackSampler:
    """Every thread's Python stack, sampled on a timer: self (innermost frame) and
    cumulative (any frame) counts per thread name."""

    def __init__(self, interval: float = 0.0005) -> None:
        self.interval = interval
        self.self_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.cum_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.samples: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():  # noqa: SLF001
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                self.samples[name] += 1
                first, seen = True, set()
                while frame is not None:
                    code = frame.f_code
                    label = f"{Path(code.co_filename).name}:{code.co_name}"
                    if first:
                        self.self_counts[name][f"{label}:{frame.f_lineno}"] += 1
                        first = False
                    if label not in seen:
                        self.cum_counts[name][label] += 1
                        seen.add(label)
                    frame = frame.f_back
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def report(self, top: int = 25) -> dict:
        return {name: {"samples": n, "self": self.self_counts[name].most_common(top),
                       "cumulative": self.cum_counts[name].most_common(top)}
                for name, n in self.samples.most_common() if n > 5}


def _batch(tok, n, tokens, watermark: bool, salt: int):
    out = []
    for i in range(n):
        key = WatermarkKey(0xC0FFEE + i, WatermarkSpec(algorithm="dual_key_gumbel"))
        plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint) if watermark else None
        out.append(GenerationRequest(f"r{salt}-{i}", tuple(tok.encode(PROMPTS[i % 4])), tokens,
                                     seed=1000 * salt + i, watermark=plan))
    return out


async def _generate(engine, requests):
    async def one(request):
        async for event in engine.generate(request):
            if isinstance(event, Finished):
                return event

    return await asyncio.gather(*(one(r) for r in requests))


async def _round(engine, requests, blocks: BlockEvents, admission: Admission):
    counts = engine._blocks.counts  # noqa: SLF001
    before = dict(vars(counts))
    steps = engine.telemetry.snapshot()["steps"]
    blocks.on = True
    _sync()
    start = time.perf_counter()
    done = await _generate(engine, requests)
    _sync()
    seconds = time.perf_counter() - start
    blocks.on = False
    steps = engine.telemetry.snapshot()["steps"] - steps
    tokens = sum(len(d.token_ids) for d in done)
    diff = {k: v - before[k] for k, v in vars(counts).items() if isinstance(v, (int, float))}
    n = max(1, diff.get("graph_replays", 0) + diff.get("eager_blocks", 0))
    host = {k.removeprefix("seconds_"): round(1e3 * v / n, 4) for k, v in diff.items() if k.startswith("seconds_")}
    return {"tokens": tokens, "seconds": round(seconds, 4), "tokens_per_second": round(tokens / seconds, 1),
            "steps": steps, "ms_per_step": round(1e3 * seconds / max(steps, 1), 3),
            "tokens_per_step": round(tokens / max(steps, 1), 2), "host_ms_per_block": host,
            **blocks.take(), **admission.take()}


def _kernels(trace_path: str, wall_s: float, blocks: int, top: int = 30) -> dict:
    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in gpu:
        by_name[e.get("name", "?")[:100]].append(e.get("dur", 0))
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in gpu)
    busy, end = 0.0, None
    for s, e in spans:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    total = sum(sum(v) for v in by_name.values())
    rows = sorted(((sum(v), len(v), k) for k, v in by_name.items()), reverse=True)[:top]
    return {"wall_s": round(wall_s, 4), "gpu_busy_fraction": round(busy / (wall_s * 1e6), 4),
            "gpu_events": len(gpu), "blocks": blocks, "gpu_events_per_block": round(len(gpu) / max(blocks, 1), 1),
            "kernel_us_total": round(total, 1),
            "top": [{"us": round(us, 1), "share": round(us / total, 4), "count": n, "us_each": round(us / n, 2),
                     "name": name} for us, n, name in rows]}


def _prefill_gpu_ms(engine, tok) -> dict:
    prompt = list(tok.encode(PROMPTS[0] + " and more words to make sixteen tokens of prompt text"))[:16]
    out = {}
    for name, group in (("target", engine.spec_target), ("draft", engine.spec.draft)):
        times = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            group.prefill(prompt)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        out[name] = round(statistics.median(times[5:]), 4)
    return out


async def main_async() -> dict:
    sizes = [int(x) for x in ARGS.requests.split(",")]
    blocks_ev, admission = BlockEvents(), Admission()
    cpu = {} if CUDA else {"static_cache": True, "speculative_blocks": True}
    engine = engine_module.LocalEngine("bundled", "hallmark-tiny-draft", device=ARGS.device, max_batch=max(sizes),
                                       speculative_k=4, **cpu)
    t = time.perf_counter()
    await engine.start()
    result = {"tree": ARGS.tree, "device": torch.cuda.get_device_name(0) if CUDA else "cpu", "startup_s": round(time.perf_counter() - t, 2),
              "command": "python bench/engine_profile.py " + " ".join(sys.argv[1:])}
    tok = engine.tokenizer()
    if ARGS.parity_out:
        import importlib.util

        # This tree's parity set, by path (the tree under test may be one without it).
        path = Path(__file__).resolve().parents[1] / "tests/service/engines/local/parity.py"
        spec = importlib.util.spec_from_file_location("engine_parity_set", path)
        parity = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(parity)
        run_parity = parity.run_parity
        t = time.perf_counter()
        outputs = await run_parity(engine, ARGS.parity_tokens, ARGS.parity_extra)
        Path(ARGS.parity_out).write_text(json.dumps({
            "recorded": f"{ARGS.tree}, {result['device']}, torch {torch.__version__}",
            "tokens": ARGS.parity_tokens, "extra_dual": ARGS.parity_extra, "outputs": outputs}, indent=1) + "\n")
        result["parity_s"] = round(time.perf_counter() - t, 2)
        admission.take()
    engine.eos_ids = frozenset()  # every request runs its --tokens
    sizes_out = {}
    for n in sizes:
        for salt in (0, 1):
            await _generate(engine, _batch(tok, n, ARGS.tokens, salt == 0, salt))
        admission.take()
        blocks_ev.take()
        rounds = {"on": [], "off": []}
        for r in range(ARGS.rounds):
            for watermark in ((True, False) if r % 2 == 0 else (False, True)):
                reqs = _batch(tok, n, ARGS.tokens, watermark, (10 if watermark else 20) + r)
                rounds["on" if watermark else "off"].append(await _round(engine, reqs, blocks_ev, admission))
        on = [x["tokens_per_second"] for x in rounds["on"]]
        off = [x["tokens_per_second"] for x in rounds["off"]]
        sizes_out[n] = {"tokens_per_second_on": statistics.median(on), "tokens_per_second_off": statistics.median(off),
                        "on_vs_off_per_round": statistics.median([a / b for a, b in zip(on, off)]), "rounds": rounds}
        print(json.dumps({"requests": n, **{k: v for k, v in sizes_out[n].items() if k != "rounds"},
                          "last_on_round": rounds["on"][-1]}), flush=True)
    result["sizes"] = sizes_out
    if ARGS.switch_ab:
        n, default, ab = sizes[-1], sys.getswitchinterval(), {"default": [], "0.0005": []}
        for r in range(ARGS.switch_ab):
            for mode in (("default", "0.0005") if r % 2 == 0 else ("0.0005", "default")):
                sys.setswitchinterval(default if mode == "default" else 0.0005)
                stats = await _round(engine, _batch(tok, n, ARGS.tokens, True, 80 + r), blocks_ev, admission)
                ab[mode].append(stats["tokens_per_second"])
        sys.setswitchinterval(default)
        result["switch_interval_ab"] = {"requests": n, "default_s": default, **ab}
        print("switch interval", json.dumps(result["switch_interval_ab"]), flush=True)
    if ARGS.profile_at:
        from torch.profiler import ProfilerActivity, profile

        n = ARGS.profile_at
        reqs = _batch(tok, n, ARGS.tokens, True, 50)
        replays = engine._blocks.counts.graph_replays  # noqa: SLF001
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
        with profile(activities=activities) as prof:
            _sync()
            t = time.perf_counter()
            await _generate(engine, reqs)
            _sync()
            wall = time.perf_counter() - t
        trace = tempfile.mktemp(suffix=".json")
        prof.export_chrome_trace(trace)
        result["profile"] = _kernels(trace, wall, engine._blocks.counts.graph_replays - replays)  # noqa: SLF001
        os.unlink(trace)
        admission.take()
        blocks_ev.take()
        with StackSampler() as sampler:
            stats = await _round(engine, _batch(tok, n, ARGS.tokens, True, 51), blocks_ev, admission)
        result["stack_sampled_round"] = {"round": stats, "threads": sampler.report()}
    result["prefill_gpu_ms"] = _prefill_gpu_ms(engine, tok) if CUDA else None
    batch1 = []
    for r in range(3):
        reqs = _batch(tok, 1, ARGS.tokens, True, 60 + r)
        _sync()
        t = time.perf_counter()
        done = await _generate(engine, reqs)
        batch1.append(1e3 * (time.perf_counter() - t) / len(done[0].token_ids))
    result["batch1_ms_per_token"] = round(statistics.median(batch1), 4)
    await engine.stop()
    return result


def main() -> None:
    result = asyncio.run(main_async())
    Path(ARGS.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    summary = {n: {k: v for k, v in s.items() if k != "rounds"} for n, s in result["sizes"].items()}
    print(json.dumps({"device": result["device"], "startup_s": result["startup_s"], "sizes": summary,
                      "batch1_ms_per_token": result["batch1_ms_per_token"],
                      "prefill_gpu_ms": result["prefill_gpu_ms"]}, indent=1))
    if "profile" in result:
        p = result["profile"]
        print("profile", {k: v for k, v in p.items() if k != "top"})
        for row in p["top"][:20]:
            print(f"  {row['us']:>10.0f} us {row['share']:.3f} x{row['count']:<6} {row['us_each']:>7.2f} {row['name'][:70]}")
        for name, t in result["stack_sampled_round"]["threads"].items():
            print("thread", name, t["samples"])
            for label, c in t["self"][:12]:
                print(f"   self {c:>6} {label}")
            for label, c in t["cumulative"][:12]:
                print(f"   cum  {c:>6} {label}")


if __name__ == "__main__":
    main()
