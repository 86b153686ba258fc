"""Tr-GoF's per-request cost at one length, old code against new in the same window.

    nice -n 10 .venv/bin/python bench/trgof_timing.py --tree OLD_TREE --tree . [--rounds 4] [--n 1000]

Each round runs one fresh child process per source tree, in the order given (A B A B ...), so
both trees see the same stretch of machine load (the shared box's CPU time swings by +-50 %).
A child is pinned to one core with numpy's thread pools at one thread and measures, exactly as
:func:`bench.robustness._timing_child` does at one length (its texts, seeds and attack): Tr-GoF
alone (statistic + exact p on scores whose p is near 1e-6) and end-to-end `detect()` (default
config, spans on) on an unwatermarked text, the watermarked text edited until Tr-GoF's exact
tail is needed, and the unedited watermarked text, for a single key and for an ordinary-coin
dual key (`auto`: max, weighted, Tr-GoF on the weighted Šidák scores, both span searches).
CPU time of the child, median and min of `--repeats`; each row names the exact tail's loop
the tree ran (compiled with numba, or numpy). The child imports `detector` and `bench` from its tree; this
script itself only needs to exist in the tree it is run from. Prints one JSON line per child
and a summary table (median over rounds of each child's median, and the smallest min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def child(tree: str, n: int, repeats: int) -> dict:
    """One measurement: `detector` (and what it imports) from `tree`; the measuring code,
    bench.robustness's timing_row, from this script's own tree, so old trees need not have it."""
    sys.path.insert(0, str(Path(tree).resolve()))
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("robustness_here", Path(__file__).with_name("robustness.py"))
    here = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(here)
    if n not in (200, 1000, 5000):
        raise SystemExit(f"--n must be one of 200, 1000, 5000 (the bench's lengths), not {n}")
    exact_runs = here.pin_and_count_exact_tails()
    # The same draws as bench.robustness._timing_child for this n (it starts at n = 200).
    rng = np.random.default_rng(5)
    for length in (200, 1000, 5000):
        if length == n:
            break
        rng.exponential(size=length)
        rng.integers(0, here.VOCAB, length)
    key = here.WatermarkKey(0x7131_0000 | (1 << 40), here.WatermarkSpec(algorithm="gumbel", context_width=here.WIDTH))
    dual = here.WatermarkKey(0x7131_0001 | (1 << 40), here.WatermarkSpec(algorithm="dual_key_gumbel",
                                                                          context_width=here.WIDTH))
    from detector import trgof

    # Trees before the compiled loop have no trgof.trgof_compiled (an editable install of
    # another checkout may still offer the module: ask the tree's own trgof).
    compiled = getattr(trgof, "trgof_compiled", None)
    loop = "compiled" if compiled is not None and compiled.available() else "numpy"
    row = {"tree": tree, "loop": loop, **here.timing_row(n, rng, key, repeats, exact_runs, digits=3, dual_key=dual)}
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
    cases = ["trgof", "unwatermarked", "edited, exact Tr-GoF tail", "watermarked",
             "dual: unwatermarked", "dual: edited, exact Tr-GoF tail", "dual: watermarked"]
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
