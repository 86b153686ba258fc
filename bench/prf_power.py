"""Detection power with 256-bit keys beside 64-bit Philox keys: the same synthetic "model"
(random logits per position, entropy set by ``scale``), the same seeds, text generated and
detected under each PRF; the watermark's statistic is the same function of the uniforms, so
the two should differ only by chance.

    .venv/bin/python -m bench.prf_power [--texts 40] [--tokens 60] [--out bench/results/prf-power.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from tests.synthetic import generate
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/prf-power.json"))
    args = parser.parse_args()
    config = DetectorConfig(spans=False)
    rows = {}
    for prf, secret in (("philox4x32-10-v1", 0x0123456789ABCDEF), ("hmac-sha256-philox-v1", 2**255 + 0xABCDEF)):
        for algorithm in ("gumbel", "dual_key_gumbel"):
            key = WatermarkKey(secret, WatermarkSpec(prf=prf, algorithm=algorithm))
            logs = []
            for seed in range(args.texts):
                tokens, _ = generate(key, args.tokens, scale=args.scale, seed=seed)
                logs.append(detect(tokens, [Candidate.inline(key)], config).log10_p_value)
            rows[f"{prf}/{algorithm}"] = {"median_log10_p": statistics.median(logs),
                                          "mean_log10_p": statistics.fmean(logs),
                                          "detected_at_1e-6": sum(v <= -6 for v in logs) / len(logs)}
            print(prf, algorithm, rows[f"{prf}/{algorithm}"], flush=True)
    out = {"command": ".venv/bin/python -m bench.prf_power " + " ".join(sys.argv[1:]),
           "texts": args.texts, "tokens": args.tokens, "scale": args.scale, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
