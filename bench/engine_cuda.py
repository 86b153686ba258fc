"""The local engine on one CUDA GPU: tokens/s at serving batch sizes, watermark on vs off,
where the time goes, and batch-1 latency, for this tree or another (``--tree``).

    python bench/engine_cuda.py --out FILE [--tree PATH] [--requests 16,64,256,512,1024]
        [--rounds 24] [--big-rounds 4] [--tokens 128] [--profile-at 256] [--stacks-at 0]
        [--parity-out FILE | --parity-check FILE] [--small-rounds 5]

``--tree`` goes first on ``sys.path`` before the engine is imported, so this one script
measures a baseline checkout in the same run (on the same card) as this tree.

Per concurrency N: two untimed warm-up batches, then ``--rounds`` rounds (``--big-rounds``
above 256), each one batch of N concurrent ``--tokens``-token requests with the watermark
on (dual key, speculative) and one with it off (no watermark, the same path minus the keyed
sampling), in alternating order, EOS ignored (as vLLM's benchmarks' ``ignore_eos``) so both
modes do the same work. Figures are per-round medians with quartiles; on/off is each
round's ratio. Per round, without a profiler: engine steps, ms per step, tokens per step;
**GPU busy**: the union of the graph-replayed blocks' spans (CUDA events recorded around
each block, a few microseconds each) over the round's wall time, which leaves out prefills
and eager blocks, so it is a lower bound; the GPU's idle time between blocks; host seconds
spent admitting; the engine's host phase counters per block. Then batch 1 (ms per token)
and single-key requests (the plain path) at 16. At ``--profile-at`` N one more
watermark-on round runs under torch.profiler: GPU busy as the union of every GPU activity
(the issue's definition) and the GPU kernels by name. ``--stacks-at`` N: one round under a
stack sampler (every thread's Python stack every ~0.5 ms).

A device run with little time: ``--rounds-at 256=24,16=6`` sets each size's rounds,
``--stop-rounds-after S`` stops a size's rounds after S seconds (each size not begun by
then still gets one round within ``--grace``), and the JSON file is rewritten after each
size, batch 1 and the profile, so a run killed at its time limit keeps what it measured.

``--parity-out`` records the fixed request set (tests/service/engines/local/parity.py) run
first; ``--parity-check`` compares this tree's outputs with such a file and says whether
each request's tokens, text, finish reason and route counts are the same.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", default=str(HERE), help="the tree whose engine runs (default: this one)")
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--draft", default="hallmark-tiny-draft")
    parser.add_argument("--requests", default="16,64,256")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=24, help="rounds of each mode per size up to 256")
    parser.add_argument("--big-rounds", type=int, default=4, help="rounds of each mode per size above 256")
    parser.add_argument("--rounds-at", default="", help="N=R,...: rounds of each mode at size N (overrides the two above)")
    parser.add_argument("--warmups", type=int, default=2, help="untimed batches per size before its rounds")
    parser.add_argument("--grace", type=float, default=20.0,
                        help="seconds past --stop-rounds-after in which a size not begun yet still runs one round")
    parser.add_argument("--stop-rounds-after", type=float, default=0.0,
                        help="seconds since the start after which no size's second round begins (0: no limit); "
                             "batch 1 and the profiled round still run")
    parser.add_argument("--small-rounds", type=int, default=5, help="rounds of batch 1 and of single-key plain")
    parser.add_argument("--profile-at", type=int, default=256, help="one profiled round at this size (0: none)")
    parser.add_argument("--stacks-at", type=int, default=0, help="one stack-sampled round at this size (0: none)")
    parser.add_argument("--parity-out", default=None)
    parser.add_argument("--parity-check", default=None)
    parser.add_argument("--parity-last", action="store_true", help="the parity set after everything else")
    parser.add_argument("--parity-tokens", type=int, default=96)
    parser.add_argument("--parity-extra", type=int, default=48)
    parser.add_argument("--engine-options", default="{}", help="JSON: more LocalEngine keyword arguments")
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


DEVICE_NAME = torch.cuda.get_device_name(0) if CUDA else "cpu"
PROMPTS = ["The function returns", "Return a new list", "This module provides", "If the argument is"]


class BlockEvents:
    """CUDA events around each graph-replayed block (wrapped around SpeculativeBlocks._launch,
    which every tree since the pipelined blocks has)."""

    def __init__(self) -> None:
        self.events: list[tuple[object, object]] = []
        self.on = False
        original = spec_block.SpeculativeBlocks._launch  # noqa: SLF001

        def launch(blocks, captured, rows, *args, **kwargs):
            if not (self.on and CUDA):
                return original(blocks, captured, rows, *args, **kwargs)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = original(blocks, captured, rows, *args, **kwargs)
            end.record()
            self.events.append((start, end))
            return out

        spec_block.SpeculativeBlocks._launch = launch  # noqa: SLF001

    def take(self, wall_s: float) -> dict:
        _sync()
        events, self.events = self.events, []
        if not events:
            return {}
        spans = [s.elapsed_time(e) for s, e in events]
        gaps = [max(0.0, events[i][1].elapsed_time(events[i + 1][0])) for i in range(len(events) - 1)]
        return {"blocks_timed": len(events), "gpu_ms_per_block": round(statistics.median(spans), 4),
                "gpu_busy_blocks": round(sum(spans) / (1e3 * wall_s), 4),
                "gpu_idle_ms_between_blocks": round(sum(gaps), 2)}


class Admission:
    """Host seconds in LocalEngine admission (whichever method the tree has)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        cls = engine_module.LocalEngine
        name = "_admit_all" if hasattr(cls, "_admit_all") else "_admit_contained"
        original = getattr(cls, name)

        def admit(engine, *args):
            t = time.perf_counter()
            try:
                return original(engine, *args)
            finally:
                self.seconds += time.perf_counter() - t

        setattr(cls, name, admit)

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return round(seconds, 4)


class StackSampler:
    """Every thread's Python stack on a timer: innermost frames and any-frame counts."""

    def __init__(self, interval: float = 0.0005) -> None:
        self.interval = interval
        self.self_counts = collections.defaultdict(collections.Counter)
        self.cum_counts = collections.defaultdict(collections.Counter)
        self.samples = collections.Counter()
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
                    label = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
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

    def report(self, top: int = 20) -> dict:
        return {name: {"samples": n, "self": self.self_counts[name].most_common(top),
                       "cumulative": self.cum_counts[name].most_common(top)}
                for name, n in self.samples.most_common() if n > 5}


def _batch(tok, n, tokens, watermark: bool, salt: int, algorithm: str = "dual_key_gumbel"):
    out, keys = [], []
    for i in range(n):
        key = WatermarkKey(0xC0FFEE + i, WatermarkSpec(algorithm=algorithm))
        plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint) if watermark else None
        keys.append(key if watermark else None)
        out.append(GenerationRequest(f"r{salt}-{i}", tuple(tok.encode(PROMPTS[i % 4])), tokens,
                                     seed=1000 * salt + i, watermark=plan))
    return out, keys


async def _generate(engine, requests):
    async def one(request):
        async for event in engine.generate(request):
            if isinstance(event, Finished):
                return event

    return await asyncio.gather(*(one(r) for r in requests))


def _spread(values: list[float]) -> dict:
    values = sorted(values)
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return {"median": round(statistics.median(values), 4), "q1": round(q[0], 4), "q3": round(q[2], 4),
            "min": round(values[0], 4), "max": round(values[-1], 4), "n": len(values)}


async def _round(engine, requests, blocks: BlockEvents, admission: Admission) -> tuple[list, dict]:
    counts = engine._blocks.counts  # noqa: SLF001
    before = {k: v for k, v in vars(counts).items() if isinstance(v, (int, float))}
    steps = engine.telemetry.snapshot()["steps"]
    admission.take()
    blocks.on = True
    _sync()
    start = time.perf_counter()
    done = await _generate(engine, requests)
    _sync()
    seconds = time.perf_counter() - start
    blocks.on = False
    steps = engine.telemetry.snapshot()["steps"] - steps
    tokens = sum(len(d.token_ids) for d in done)
    diff = {k: v - before[k] for k, v in vars(counts).items() if k in before}
    n = max(1, diff.get("graph_replays", 0) + diff.get("eager_blocks", 0))
    return done, {"tokens": tokens, "seconds": round(seconds, 4), "tokens_per_second": round(tokens / seconds, 1),
                  "steps": steps, "ms_per_step": round(1e3 * seconds / max(steps, 1), 3),
                  "tokens_per_step": round(tokens / max(steps, 1), 2), "admission_s": admission.take(),
                  "host_ms_per_block": {k.removeprefix("seconds_"): round(1e3 * v / n, 4) for k, v in diff.items()
                                        if k.startswith("seconds_")},
                  **blocks.take(seconds)}


def _kernels(trace_path: str, wall_s: float, top: int = 25) -> dict:
    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in gpu:
        by_name[e.get("name", "?")[:100]].append(e.get("dur", 0))
    busy, end = 0.0, None
    for s, e in sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in gpu):
        if end is None or s > end:
            busy, end = busy + e - s, e
        elif e > end:
            busy, end = busy + e - end, e
    total = sum(sum(v) for v in by_name.values()) or 1.0
    rows = sorted(((sum(v), len(v), k) for k, v in by_name.items()), reverse=True)[:top]
    return {"gpu_busy_fraction": round(busy / (wall_s * 1e6), 4), "gpu_events": len(gpu),
            "kernel_us_total": round(total, 1),
            "top_kernels": [{"us": round(us, 1), "share": round(us / total, 4), "count": n, "name": name}
                            for us, n, name in rows]}


def _parity_module():
    path = HERE / "tests/service/engines/local/parity.py"  # this tree's set, by path (--tree may lack it)
    spec = importlib.util.spec_from_file_location("engine_parity_set", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _parity(engine, result: dict) -> None:
    outputs = await _parity_module().run_parity(engine, ARGS.parity_tokens, ARGS.parity_extra)
    recorded = f"{ARGS.tree}, {DEVICE_NAME}, torch {torch.__version__}"
    if ARGS.parity_out:
        Path(ARGS.parity_out).write_text(json.dumps({"recorded": recorded, "tokens": ARGS.parity_tokens,
                                                     "extra_dual": ARGS.parity_extra, "outputs": outputs},
                                                    indent=1) + "\n")
    if ARGS.parity_check:
        old = json.loads(Path(ARGS.parity_check).read_text())
        same = [a == b for a, b in zip(outputs, old["outputs"])]
        tokens_same = [a["token_ids"] == b["token_ids"] for a, b in zip(outputs, old["outputs"])]
        result["parity"] = {"against": old["recorded"], "requests": len(outputs),
                            "identical": sum(same), "tokens_identical": sum(tokens_same),
                            "differing": [i for i, s in enumerate(same) if not s]}
        print("parity", json.dumps(result["parity"]), flush=True)


async def main_async() -> dict:
    sizes = [int(x) for x in ARGS.requests.split(",")]
    rounds_at = {int(n): int(r) for n, r in (x.split("=") for x in ARGS.rounds_at.split(",") if x)}
    blocks, admission = BlockEvents(), Admission()
    options = json.loads(ARGS.engine_options)
    if not CUDA:  # the CUDA path's blocks, eagerly (and text on its thread, where the tree has one)
        import inspect

        threaded = "streamer_thread" in inspect.signature(engine_module.LocalEngine).parameters
        options = {"static_cache": True, "speculative_blocks": True, **({"streamer_thread": True} if threaded else {}),
                   **options}
    most = max(sizes + [64])
    engine = engine_module.LocalEngine(ARGS.model, ARGS.draft, device=ARGS.device, max_batch=most,
                                       max_queue=2 * most, speculative_k=4, **options)
    t = time.perf_counter()
    await engine.start()
    result = {"tree": ARGS.tree, "device": DEVICE_NAME, "torch": torch.__version__,
              "python": sys.version.split()[0], "engine_options": options,
              "startup_seconds": round(time.perf_counter() - t, 2),
              "command": "python bench/engine_cuda.py " + " ".join(sys.argv[1:])}
    groups = {"plain": engine.plain, "speculative_target": engine.spec_target, "speculative_draft": engine.spec.draft}
    result["batched_prefill"] = {name: getattr(g, "batched_prefill", None) for name, g in groups.items()}
    print("started", json.dumps(result), flush=True)
    tok = engine.tokenizer()
    if (ARGS.parity_out or ARGS.parity_check) and not ARGS.parity_last:
        await _parity(engine, result)
    eos_ids, engine.eos_ids = engine.eos_ids, frozenset()  # every request generates exactly --tokens tokens
    began = time.perf_counter()  # --stop-rounds-after counts from here (a fresh machine's start varies)
    result["sizes"] = {}
    detection_rows = None
    def out_of_time(grace: float = 0.0) -> bool:
        return bool(ARGS.stop_rounds_after) and time.perf_counter() - began > ARGS.stop_rounds_after + grace

    for n in sizes:
        if out_of_time(ARGS.grace):  # past the limit, a size still gets one round within the grace
            print(json.dumps({"requests": n, "skipped": "--stop-rounds-after"}), flush=True)
            continue
        for salt in range(ARGS.warmups):
            await _generate(engine, _batch(tok, n, ARGS.tokens, salt % 2 == 0, salt)[0])
        rounds = {"on": [], "off": []}
        for r in range(rounds_at.get(n, ARGS.rounds if n <= 256 else ARGS.big_rounds)):
            if out_of_time() and r > 0:
                break
            for watermark in ((True, False) if r % 2 == 0 else (False, True)):
                reqs, keys = _batch(tok, n, ARGS.tokens, watermark, (10 if watermark else 20) + r)
                done, stats = await _round(engine, reqs, blocks, admission)
                rounds["on" if watermark else "off"].append(stats)
                result["sizes"][n] = {"partial": True, "rounds": rounds}  # a run killed mid-size keeps its rounds
                Path(ARGS.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
                if watermark and n == 256:
                    detection_rows = (keys, done)
        on = [s["tokens_per_second"] for s in rounds["on"]]
        off = [s["tokens_per_second"] for s in rounds["off"]]
        summary = {"tokens_per_second_on": _spread(on), "tokens_per_second_off": _spread(off),
                   "on_vs_off_per_round": _spread([a / b for a, b in zip(on, off)]),
                   "ms_per_step_on": _spread([s["ms_per_step"] for s in rounds["on"]]),
                   "tokens_per_step_on": _spread([s["tokens_per_step"] for s in rounds["on"]]),
                   "tokens_per_step_off": _spread([s["tokens_per_step"] for s in rounds["off"]])}
        for key in ("gpu_busy_blocks", "gpu_ms_per_block", "admission_s", "gpu_idle_ms_between_blocks"):
            values = [s[key] for s in rounds["on"] if key in s]
            if values:
                summary[f"{key}_on"] = _spread(values)
        summary["host_ms_per_block_on"] = rounds["on"][-1]["host_ms_per_block"]
        result["sizes"][n] = {"summary": summary, "rounds": rounds}
        print(json.dumps({"requests": n, **{k: (v["median"] if isinstance(v, dict) and "median" in v else v)
                                             for k, v in summary.items()}}), flush=True)
        Path(ARGS.out).write_text(json.dumps(result, indent=1, default=str) + "\n")  # what is done so far
    batch1, plain = [], []
    for r in range(ARGS.small_rounds):
        reqs, _ = _batch(tok, 1, ARGS.tokens, True, 60 + r)
        _sync()
        t = time.perf_counter()
        done = await _generate(engine, reqs)
        batch1.append(1e3 * (time.perf_counter() - t) / len(done[0].token_ids))
        reqs, _ = _batch(tok, 16, ARGS.tokens, True, 70 + r, algorithm="gumbel")
        _sync()
        t = time.perf_counter()
        done = await _generate(engine, reqs)
        plain.append(sum(len(d.token_ids) for d in done) / (time.perf_counter() - t))
        result["batch1_ms_per_token"] = _spread(batch1)
        result["single_key_plain_16_tokens_per_second"] = _spread(plain)
        Path(ARGS.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print("batch1", json.dumps({"ms_per_token": batch1[-1], "plain16_tok_s": plain[-1]}), flush=True)
    if ARGS.profile_at:
        from torch.profiler import ProfilerActivity, profile

        reqs, _ = _batch(tok, ARGS.profile_at, ARGS.tokens, True, 50)
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])) as prof:
            _sync()
            t = time.perf_counter()
            await _generate(engine, reqs)
            _sync()
            wall = time.perf_counter() - t
        trace = tempfile.mktemp(suffix=".json")
        prof.export_chrome_trace(trace)
        result["profiled_round"] = {"requests": ARGS.profile_at, "seconds": round(wall, 4),
                                    "tokens_per_second_under_profiler": round(ARGS.profile_at * ARGS.tokens / wall, 1),
                                    **_kernels(trace, wall)}
        Path(trace).unlink()
        Path(ARGS.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print("profile", json.dumps({k: v for k, v in result["profiled_round"].items() if k != "top_kernels"}),
              flush=True)
    if ARGS.stacks_at:
        with StackSampler() as sampler:
            _, stats = await _round(engine, _batch(tok, ARGS.stacks_at, ARGS.tokens, True, 51)[0], blocks,
                                    admission)
        result["stack_sampled_round"] = {"round": stats, "threads": sampler.report()}
    if (ARGS.parity_out or ARGS.parity_check) and ARGS.parity_last:
        engine.eos_ids = eos_ids
        await _parity(engine, result)
        Path(ARGS.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    result["speculative_blocks"] = {k: v for k, v in vars(engine._blocks.counts).items()  # noqa: SLF001
                                    if isinstance(v, (int, float))}
    result["telemetry"] = engine.telemetry.snapshot()
    await engine.stop()
    if detection_rows is not None:
        from detector.detect import detect
        from detector.result import Candidate

        keys, done = detection_rows
        p_own = [detect(d.token_ids, [Candidate.inline(k)]).log10_p_value for k, d in zip(keys[:32], done)]
        p_wrong = [detect(d.token_ids, [Candidate.inline(WatermarkKey(k.secret ^ 1, k.spec))]).log10_p_value
                   for k, d in zip(keys[:32], done)]
        result["detection_256_first_32"] = {"log10_p_own_key_max": max(p_own), "log10_p_wrong_key_min": min(p_wrong)}
    return result


def main() -> None:
    result = asyncio.run(main_async())
    Path(ARGS.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = []
    for n, s in result["sizes"].items():
        m = s["summary"]
        table.append(f"{n:>5} on {m['tokens_per_second_on']['median']:>9.0f} off {m['tokens_per_second_off']['median']:>9.0f}"
                     f" on/off {m['on_vs_off_per_round']['median']:.3f} busy "
                     f"{m.get('gpu_busy_blocks_on', {}).get('median', float('nan')):.3f}"
                     f" ms/step {m['ms_per_step_on']['median']:.2f} tok/step {m['tokens_per_step_on']['median']:.1f}")
    print("\n".join(table))
    print("batch1 ms/token", result.get("batch1_ms_per_token", {}).get("median"), "startup", result["startup_seconds"],
          "parity", result.get("parity"))


if __name__ == "__main__":
    main()
