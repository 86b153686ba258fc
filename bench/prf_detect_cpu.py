"""CPU detection with 256-bit keys beside Philox keys, one thread, same texts, same run.

    .venv/bin/python -m bench.prf_detect_cpu [--out bench/results/prf-detect-cpu.json]
    .venv/bin/python -m bench.prf_detect_cpu --compressions   # ns a SHA-256 compression, each path

For each PRF (``philox4x32-10-v1``, ``hmac-sha256-philox-v1``, vLLM's ``hmac-sha256-v1``),
spec (``gumbel``, ``dual_key_gumbel``; ``deterministic``; ``diverse`` with salts: 16 salted keys
tested; ``diverse`` with head diversity, new keys' default: one key) and text length (200 and 20,000 tokens of random ids, vocabulary 8192; detection
cost does not depend on whether a text is watermarked): the time of
:func:`detector.detect.detect` after a warm-up (numba compiled and loaded), and of the PRF
alone (``detector.scoring.uniforms_many`` over the text's scored positions). The goal of
issue 36: detection with the new PRF within 2x of Philox's.

The box is shared (other jobs come and go), so each call is timed by the thread's CPU time
(not wall time) and the three PRFs of a configuration are timed interleaved, call by call (a burst of load hits all three alike), and each row gives the
median and the minimum of its calls; ``*_over_philox`` are ratios of medians, ``*_over_philox_min``
of minima (the least disturbed calls).
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
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from detector import scoring  # noqa: E402
from detector.detect import DetectorConfig, detect  # noqa: E402
from detector.result import Candidate, salted_candidates  # noqa: E402
from watermark import jit  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

PRFS = ("philox4x32-10-v1", "hmac-sha256-philox-v1", "hmac-sha256-v1")



def _interleaved(fns: dict, repeats: int) -> dict:
    """{name: (median s, min s)} of the CPU time of ``repeats`` calls of each function, the
    functions called in turn (after one warm-up call each). The calling thread's CPU time, not
    wall time: on a shared box, time spent descheduled is not the PRF's."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.thread_time()
            fn()
            times[name].append(time.thread_time() - start)
    return {name: (float(np.median(t)), float(np.min(t))) for name, t in times.items()}


def compressions(repeats: int) -> dict:
    """ns per SHA-256 compression of the HMAC lane passes' compression step
    (``hmac_compiled._compress_lanes`` over all LANES columns, many times a call): the lane
    arithmetic, and the SHA extensions (watermark.prf.sha_ni) at 1, 2, 4 and 8 messages
    interleaved a call where the CPU has them; and the per-row passes' step
    (``hmac_compiled._compress``, one message a call) on both paths. Median and minimum of ``repeats`` interleaved
    calls (thread CPU time)."""
    from numba import njit

    from watermark.prf import hmac_compiled, sha_ni

    lanes, rounds = hmac_compiled.LANES, 2000
    step = hmac_compiled.compiled()["_compress_lanes"]

    @njit
    def through_passes(st, w, v, sha):  # pragma: no cover - compiled
        for _ in range(rounds):
            step(st, w, lanes, v, sha)

    def interleaved(group):
        compress = sha_ni.lanes_intrinsic(group)

        @njit
        def run(st, w, v, sha):  # pragma: no cover - compiled
            for _ in range(rounds):
                for j in range(0, lanes, group):
                    compress(st, w, j)

        return run

    one = hmac_compiled.compiled()["_compress"]

    @njit
    def one_by_one(st, w, v, sha):  # pragma: no cover - compiled
        # the per-row passes' step: one message a call, as its own 1-D state and block
        state, block = np.empty(8, np.uint32), np.empty(64, np.uint32)
        for _ in range(rounds):
            for j in range(lanes):
                for i in range(8):
                    state[i] = st[i, j]
                for i in range(16):
                    block[i] = w[i, j]
                one(state, block, sha)
                for i in range(8):
                    st[i, j] = state[i]

    runs = {"lanes": (through_passes, False), "per row": (one_by_one, False)}
    if sha_ni.available():
        runs["sha-ni"] = (through_passes, True)
        runs["per row, sha-ni"] = (one_by_one, True)
        runs.update({f"sha-ni, {g} a call": (interleaved(g), True) for g in (1, 2, 4, 8)})
    rng = np.random.default_rng(0)
    state = rng.integers(0, 2**32, (8, lanes), dtype=np.uint64).astype(np.uint32)
    block = rng.integers(0, 2**32, (64, lanes), dtype=np.uint64).astype(np.uint32)
    results = {}
    for name, (fn, sha) in runs.items():  # same bits on every path (and compiled before timing)
        st = state.copy()
        fn(st, block.copy(), np.empty((8, lanes), np.uint32), sha)
        results.setdefault("state", st)
        if not np.array_equal(st, results["state"]):
            raise SystemExit(f"{name}: a different state")
    times = _interleaved({name: (lambda f=fn, s=sha: f(state.copy(), block.copy(), np.empty((8, lanes), np.uint32), s))
                          for name, (fn, sha) in runs.items()}, repeats)
    per = 1e9 / (rounds * lanes)
    return {name: {"ns": med * per, "ns_min": low * per} for name, (med, low) in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/prf-detect-cpu.json"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compressions", action="store_true",
                        help="time one SHA-256 compression on each path instead (prints JSON)")
    args = parser.parse_args()
    jit.load()
    if args.compressions:
        print(json.dumps({"command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.prf_detect_cpu "
                          + " ".join(sys.argv[1:]), "load_average": os.getloadavg(),
                          "ns_per_compression": compressions(args.repeats)}, indent=1))
        return 0
    rng = np.random.default_rng(36)
    texts = {n: rng.integers(0, 8192, n).tolist() for n in (200, 20_000)}
    rows = []
    for algorithm in ("gumbel", "dual_key_gumbel"):
        for mode in ("deterministic", "diverse-salt", "diverse-head"):
            for n, tokens in texts.items():
                calls = {}
                for prf in PRFS:
                    secret = 0x0123456789ABCDEF if prf.startswith("philox") else (2**255 + 0xABCDEF)
                    extra = {} if mode == "deterministic" else (
                        {"mode": "diverse", "diversity": "salt"} if mode == "diverse-salt" else
                        {"mode": "diverse", "diversity": "head", "dedup": "all"})
                    key = WatermarkKey(secret, WatermarkSpec(algorithm=algorithm, prf=prf, **extra))
                    candidates = salted_candidates([Candidate.inline(key)])
                    config = DetectorConfig()
                    scored = scoring.scored_positions(np.array(tokens), key.spec.context_width, key.spec.dedup)
                    requests = [(k, None) for c in candidates for k in c.key.scoring_keys()]
                    calls[prf] = (len(requests),
                                  lambda t=tokens, c=candidates, cf=config: detect(t, c, cf),
                                  lambda r=requests, sc=scored, p=prf: scoring.uniforms_many(r, sc, p))
                detect_t = _interleaved({p: c[1] for p, c in calls.items()}, args.repeats)
                prf_t = _interleaved({p: c[2] for p, c in calls.items()}, args.repeats)
                base = None
                for prf in PRFS:
                    (d_med, d_min), (p_med, p_min) = detect_t[prf], prf_t[prf]
                    row = {"algorithm": algorithm, "mode": mode, "tokens": n, "prf": prf,
                           "keys_tested": calls[prf][0], "detect_ms": d_med * 1e3, "detect_min_ms": d_min * 1e3,
                           "prf_ms": p_med * 1e3, "prf_min_ms": p_min * 1e3, "detect_mtok_s": n / d_med / 1e6}
                    if base is None:
                        base = row
                    else:
                        row["detect_over_philox"] = row["detect_ms"] / base["detect_ms"]
                        row["detect_over_philox_min"] = row["detect_min_ms"] / base["detect_min_ms"]
                        row["prf_over_philox"] = row["prf_ms"] / base["prf_ms"]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    out = {"command": "OMP_NUM_THREADS=1 .venv/bin/python -m bench.prf_detect_cpu " + " ".join(sys.argv[1:]),
           "machine": platform.machine(), "threads": 1,
           "note": "shared 2-core box, other jobs running (load average given): the thread's CPU time "
                   "(time.thread_time) of each call, PRFs timed interleaved; ratios within one run are the "
                   "figure, absolute times vary",
           "load_average": os.getloadavg(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
