"""Corpus scan throughput, end to end (`service.scan.run.scan`: read, detect, write verdicts).

    .venv/bin/python -m bench.scan --device cpu [--texts 200 --keys 1000 --tokens 1000]
    python3 -m bench.scan --device cuda --workers 16 --texts 20000 --keys 1000   (a GPU machine)

A JSONL corpus of ``--texts`` random-token texts of ``--tokens`` tokens (one in
``--marked-every`` watermarked under one of the keys), against ``--keys`` keys of one spec (``--algorithm``:
`gumbel`, or `dual_key_gumbel` with an ordinary coin), each text's verdict written as
`hallmark scan` writes it (the store is not involved: keys are made here, so the run needs
no database). A warm-up scan of a few texts first (numba's cache, the kernel's compile).
Reported: texts/s and key.tokens/s (texts x tokens x keys / seconds), per worker for CPU
runs, key.tokens per CPU second (this process and its workers: what other load on a shared
machine disturbs least), and for GPU runs the kernel's share of the time; the verdicts are checked (the
watermarked texts are found under their key, no other text is).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from detector.detect import DetectorConfig  # noqa: E402
from detector.multikey import KeySet  # noqa: E402
from detector.result import Candidate  # noqa: E402
from service.scan import run as scan_run  # noqa: E402
from service.scan.verdicts import ScanSettings  # noqa: E402
from watermark import jit  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402


def _corpus(path: Path, keys: list[Candidate], texts: int, tokens: int, seed: int, every: int = 20) -> set[int]:
    from bench.multikey import watermarked

    rng = np.random.default_rng(seed)
    marked = set()
    owner = keys[len(keys) // 2].key
    with open(path, "w") as handle:
        for line in range(1, texts + 1):
            if line % every == 1:
                ids = watermarked(owner, tokens, rng)
                marked.add(line)
            else:
                ids = rng.integers(0, 32000, tokens).tolist()
            handle.write(json.dumps({"id": line, "token_ids": ids}) + "\n")
    return marked


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--algorithm", default="gumbel", choices=["gumbel", "dual_key_gumbel"])
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--marked-every", type=int, default=20, help="one text in this many is watermarked")
    parser.add_argument("--compare-cpu", type=int, default=0,
                        help="scan the first N texts again on the CPU: the verdicts must be identical")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    spec = WatermarkSpec(algorithm=args.algorithm)
    keys = [Candidate.inline(WatermarkKey(int(rng.integers(0, 2**63)) * 2 + 1, spec), f"k{i}") for i in range(args.keys)]
    keyset = KeySet.of(keys)
    batch = args.batch or (1024 if args.device != "cpu" else 16)
    jit.load()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _corpus(tmp / "warm.jsonl", keys, min(args.texts, 2 * max(1, args.workers)), args.tokens, 2)
        settings = ScanSettings(config=DetectorConfig())
        scan_run.scan(tmp / "warm.jsonl", tmp / "warm.out", keyset, settings, workers=args.workers,
                      device=args.device, batch=batch)
        marked = _corpus(tmp / "in.jsonl", keys, args.texts, args.tokens, 3, args.marked_every)
        kernel_seconds = [0.0]
        if args.device != "cpu":
            from service.scan import gpu

            original = gpu.GpuScanner.stats

            def timed(self, forms):
                import torch

                start = time.perf_counter()
                out = original(self, forms)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                kernel_seconds[0] += time.perf_counter() - start
                return out

            gpu.GpuScanner.stats = timed
        import resource

        def cpu_now() -> float:
            own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

        start, cpu_start = time.perf_counter(), cpu_now()
        summary = scan_run.scan(tmp / "in.jsonl", tmp / "out.jsonl", keyset, settings, workers=args.workers,
                                device=args.device, batch=batch)
        seconds = time.perf_counter() - start
        cpu_seconds = cpu_now() - cpu_start  # (workers' CPU counts once they have exited)
        verdicts = [json.loads(line) for line in open(tmp / "out.jsonl")]
        same_as_cpu = None
        if args.compare_cpu and args.device != "cpu":
            with open(tmp / "in.jsonl") as source, open(tmp / "head.jsonl", "w") as head:
                for _, line in zip(range(args.compare_cpu), source):
                    head.write(line)
            scan_run.scan(tmp / "head.jsonl", tmp / "head-cpu.jsonl", keyset, settings, workers=args.workers,
                          device="cpu", batch=16)
            cpu = [json.loads(line) for line in open(tmp / "head-cpu.jsonl")]
            same_as_cpu = cpu == verdicts[:len(cpu)]
    found = {v["line"] for v in verdicts if v.get("watermarked")}
    right_key = all(v["key"]["key_id"] == keys[len(keys) // 2].info.key_id for v in verdicts if v.get("watermarked"))
    key_tokens = args.texts * args.tokens * args.keys
    result = {"command": "python -m bench.scan " + " ".join(sys.argv[1:]), "device": args.device,
              "workers": args.workers, "texts": args.texts, "keys": args.keys, "tokens": args.tokens,
              "algorithm": args.algorithm, "batch": batch, "seconds": round(seconds, 3),
              "texts_per_s": args.texts / seconds, "key_tokens_per_s": key_tokens / seconds,
              "key_tokens_per_s_per_worker": key_tokens / seconds / max(1, args.workers),
              "cpu_seconds": round(cpu_seconds, 3), "key_tokens_per_cpu_s": key_tokens / cpu_seconds,
              "verdicts_ok": found == marked and right_key and summary.failed == 0,
              "found": len(found), "marked": len(marked), "python": platform.python_version(),
              "verdicts_identical_to_cpu_scan": same_as_cpu, "compared_with_cpu": args.compare_cpu,
              "load_average_at_end": os.getloadavg()}
    if args.device != "cpu":
        import torch

        result["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "interpreter"
        result["gpu_stats_seconds"] = round(kernel_seconds[0], 3)
        result["gpu_stats_share"] = kernel_seconds[0] / seconds
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["verdicts_ok"] and same_as_cpu is not False else 1


if __name__ == "__main__":
    sys.exit(main())
