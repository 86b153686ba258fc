"""Tr-GoF's per-request cost at one length, old code against new in the same window.

    nice -n 10 .venv/bin/python bench/trgof_timing.py --tree OLD_TREE --tree . [--rounds 4] [--n 1000]

Each round runs one fresh child process per source tree, in the order given (A B A B ...), so
both trees see the same stretch of machine load (the shared box's CPU time swings by +-50 %).
A child is pinned to one core with numpy's thread pools at one thread and measures, exactly as
:func:`bench.robustness._timing_child` does at one length (its texts, seeds and attack): Tr-GoF
alone (statistic + exact p on scores whose p is near 1e-6) and end-to-end `detect()` (default
config, single key, spans on) on an unwatermarked text, the watermarked text edited until
Tr-GoF's exact tail is needed, and the unedited watermarked text. CPU time of the child,
median and min of `--repeats`. The child imports `detector` and `bench` from its tree; this
script itself only needs to exist in the tree it is run from. Prints one JSON line per child
and a summary table (median over rounds of each child's median, and the smallest min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def child(tree: str, n: int, repeats: int) -> dict:
    sys.path.insert(0, str(Path(tree).resolve()))
    import numpy as np

    from bench.robustness import SIGMAS, VOCAB, WIDTH, attack, generate
    from detector import trgof
    from detector.detect import detect
    from detector.result import Candidate
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    exact_runs = {"count": 0}
    crossing = trgof._crossing_exact

    def counted(*args):
        exact_runs["count"] += 1
        return crossing(*args)

    trgof._crossing_exact = counted  # counts the exact tails (bench only)

    def clock(fn) -> dict:
        fn()
        cpu = []
        for _ in range(repeats):
            start = time.process_time()
            fn()
            cpu.append((time.process_time() - start) * 1e3)
        return {"median_ms": round(float(np.median(cpu)), 3), "min_ms": round(float(np.min(cpu)), 3)}

    # The same draws as bench.robustness._timing_child for this n (it starts at n = 200).
    rng = np.random.default_rng(5)
    key = WatermarkKey(0x7131_0000 | (1 << 40), WatermarkSpec(algorithm="gumbel", context_width=WIDTH))
    for length in (200, 1000, 5000):
        base = rng.exponential(size=length)
        if length == n:
            break
        rng.integers(0, VOCAB, length)
    else:
        raise SystemExit(f"--n must be one of 200, 1000, 5000 (the bench's lengths), not {n}")
    lo, hi = 0.0, 20.0
    for _ in range(40):
        boost = 0.5 * (lo + hi)
        scores = base.copy()
        scores[: n // 20] += boost
        lo, hi = (boost, hi) if trgof.log10_pvalue(scores) > -6.0 else (lo, boost)
    row = {"tree": tree, "n": n, "trgof_log10_p": round(trgof.log10_pvalue(scores), 3),
           "trgof": clock(lambda: trgof.log10_pvalue(scores))}
    marked = generate([key], n, SIGMAS[1.7], seed=n)[0]
    texts = {"unwatermarked": [int(t) for t in rng.integers(0, VOCAB, n)], "watermarked": marked}
    for rate in np.arange(0.3, 0.95, 0.05):  # the least editing that needs the exact tail
        edited = attack(marked, "substitution", float(rate), np.random.default_rng(n))
        exact_runs["count"] = 0
        result = detect(edited, [Candidate.inline(key)])
        if exact_runs["count"] and result.log10_p_value < -2.0:
            texts["edited, exact Tr-GoF tail"] = edited
            row["edited_rate"] = round(float(rate), 2)
            break
    for name, tokens in texts.items():
        exact_runs["count"] = 0
        result = detect(tokens, [Candidate.inline(key)])
        row[name] = {**clock(lambda: detect(tokens, [Candidate.inline(key)])),
                     "log10_p": round(result.log10_p_value, 3), "exact_tail": exact_runs["count"] > 0}
    row["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="source tree (repeat: A, B, ...)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.tree[0], args.n, args.repeats)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    rows = []
    for _ in range(args.rounds):
        for tree in args.tree:
            done = subprocess.run([sys.executable, __file__, "--child", "--tree", tree, "--n", str(args.n),
                                   "--repeats", str(args.repeats)], env=env, capture_output=True, text=True,
                                  check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    cases = ["trgof", "unwatermarked", "edited, exact Tr-GoF tail", "watermarked"]
    print(f"\n| tree | {' | '.join(cases)} |\n|---|{'---|' * len(cases)}")
    for tree in args.tree:
        mine = [r for r in rows if r["tree"] == tree]
        cells = []
        for case in cases:
            medians = sorted(r[case]["median_ms"] for r in mine if case in r)
            mins = [r[case]["min_ms"] for r in mine if case in r]
            cells.append(f"{medians[len(medians) // 2]:.2f} (min {min(mins):.2f})" if medians else "-")
        print(f"| {tree} | {' | '.join(cells)} |")
    loads = [r["load_average"][0] for r in rows]
    print(f"\n1-min load average across the children: {min(loads)}-{max(loads)}")


if __name__ == "__main__":
    main()
