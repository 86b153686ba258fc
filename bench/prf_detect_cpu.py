"""CPU detection with 256-bit keys beside Philox keys, one thread, same texts, same run.

    .venv/bin/python -m bench.prf_detect_cpu [--out bench/results/prf-detect-cpu.json]

For each PRF (``philox4x32-10-v1``, ``hmac-sha256-philox-v1``, vLLM's ``hmac-sha256-v1``),
spec (``gumbel``, ``dual_key_gumbel``; ``deterministic``; ``diverse`` with salts: 16 salted keys
tested; ``diverse`` with head diversity, new keys' default: one key) and text length (200 and 20,000 tokens of random ids, vocabulary 8192; detection
cost does not depend on whether a text is watermarked): the median time of
:func:`detector.detect.detect` after a warm-up (numba compiled and loaded), and of the PRF
alone (``detector.scoring.uniforms_many`` over the text's scored positions). The goal of
issue 36: detection with the new PRF within 2x of Philox's.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from detector import scoring  # noqa: E402
from detector.detect import DetectorConfig, detect  # noqa: E402
from detector.result import Candidate, salted_candidates  # noqa: E402
from watermark import jit  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402
from bench.detect_throughput import _median_seconds as _median_s  # noqa: E402

PRFS = ("philox4x32-10-v1", "hmac-sha256-philox-v1", "hmac-sha256-v1")



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/prf-detect-cpu.json"))
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    jit.load()
    rng = np.random.default_rng(36)
    texts = {n: rng.integers(0, 8192, n).tolist() for n in (200, 20_000)}
    rows = []
    for algorithm in ("gumbel", "dual_key_gumbel"):
        for mode in ("deterministic", "diverse-salt", "diverse-head"):
            for n, tokens in texts.items():
                base = {}
                for prf in PRFS:
                    secret = 0x0123456789ABCDEF if prf.startswith("philox") else (2**255 + 0xABCDEF)
                    extra = {} if mode == "deterministic" else (
                        {"mode": "diverse", "diversity": "salt"} if mode == "diverse-salt" else
                        {"mode": "diverse", "diversity": "head", "dedup": "all"})
                    key = WatermarkKey(secret, WatermarkSpec(algorithm=algorithm, prf=prf, **extra))
                    candidates = salted_candidates([Candidate.inline(key)])
                    config = DetectorConfig()
                    repeats = args.repeats if n <= 200 or prf.startswith("philox") else max(3, args.repeats // 2)
                    detect_s = _median_s(lambda: detect(tokens, candidates, config), repeats)
                    scored = scoring.scored_positions(np.array(tokens), key.spec.context_width, key.spec.dedup)
                    requests = [(k, None) for c in candidates for k in c.key.scoring_keys()]
                    prf_s = _median_s(lambda: scoring.uniforms_many(requests, scored, prf), repeats)
                    row = {"algorithm": algorithm, "mode": mode, "tokens": n, "prf": prf,
                           "keys_tested": len(requests), "detect_ms": detect_s * 1e3, "prf_ms": prf_s * 1e3,
                           "detect_mtok_s": n / detect_s / 1e6}
                    if prf.startswith("philox"):
                        base = row
                    else:
                        row["detect_over_philox"] = detect_s * 1e3 / base["detect_ms"]
                        row["prf_over_philox"] = prf_s * 1e3 / base["prf_ms"]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    out = {"command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.prf_detect_cpu " + " ".join(sys.argv[1:]),
           "machine": platform.machine(), "threads": 1,
           "note": "shared 2-core box, other jobs running: ratios within one run are the figure; absolute times "
                   "vary", "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
