"""Detection throughput, one thread: Hallmark's detector against vLLM 0.32's reference
detector (the baseline), on the same texts in the same run.

    .venv/bin/python -m bench.detect_throughput [--out bench/results/detect_throughput.json]

Texts are random token ids (vocabulary 8192): throughput does not depend on whether the
text is watermarked. Each figure is the median of repeated runs after a warm-up.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from detector.detect import DetectorConfig, detect  # noqa: E402
from detector.result import Candidate  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _vllm_detectors(key: int):
    try:
        from vllm.v1.watermarking.gumbel import DualKeyGumbelWatermarkDetector, GumbelWatermarkDetector
    except Exception as exc:  # vLLM is an optional extra
        print(f"vLLM baseline unavailable: {exc}")
        return None
    return {"gumbel": GumbelWatermarkDetector(key=key), "dual_key_gumbel": DualKeyGumbelWatermarkDetector(key=key)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/detect_throughput.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    key = 0x5EED_1234_ABCD_0042
    baseline = _vllm_detectors(key)
    config = DetectorConfig(spans=False)
    rows = []
    for algorithm, statistic in [("gumbel", "auto"), ("dual_key_gumbel", "max"), ("dual_key_gumbel", "weighted")]:
        candidate = Candidate.inline(WatermarkKey(key, WatermarkSpec(algorithm=algorithm)))
        cfg = config.model_copy(update={"dual_statistic": statistic})
        for length, repeats in [(200, 400), (20_000, 15)]:
            tokens = rng.integers(0, 8192, length)
            token_list = tokens.tolist()
            ours = _median_seconds(lambda: detect(tokens, [candidate], cfg), repeats)
            row = {"algorithm": algorithm, "statistic": statistic, "tokens": length,
                   "hallmark_ms": ours * 1e3, "hallmark_mtok_s": length / ours / 1e6}
            if baseline is not None and statistic in ("auto", "weighted"):
                theirs = _median_seconds(lambda: baseline[algorithm].detect(token_list), max(3, repeats // 10))
                row.update({"vllm_ms": theirs * 1e3, "vllm_mtok_s": length / theirs / 1e6,
                            "speedup_vs_vllm": theirs / ours})
            rows.append(row)
    print(f"{'algorithm':16} {'statistic':9} {'tokens':>7} {'hallmark ms':>12} {'M tok/s':>8} "
          f"{'vLLM ms':>9} {'M tok/s':>8} {'speed-up':>9}")
    for r in rows:
        print(f"{r['algorithm']:16} {r['statistic']:9} {r['tokens']:7d} {r['hallmark_ms']:12.3f} "
              f"{r['hallmark_mtok_s']:8.2f} {r.get('vllm_ms', float('nan')):9.3f} "
              f"{r.get('vllm_mtok_s', float('nan')):8.2f} {r.get('speedup_vs_vllm', float('nan')):9.1f}")
    out = {"machine": platform.processor() or platform.machine(), "threads": 1, "rows": rows,
           "command": "python -m bench.detect_throughput"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
