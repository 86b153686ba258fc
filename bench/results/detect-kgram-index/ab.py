"""One process, the same code: the look-up of 4 warm distinct bench requests (bench.detect_profile
--route --tier expert --distinct set-up) replayed with the index (ledger.kgram_index.ENABLED)
and with the probe, alternated batch by batch (best of 9 batches of 40 calls, thread CPU time
per call, mean over the 4), so the box's load falls on both alike.

    PYTHONPATH=. nice -n 5 .venv/bin/python bench/results/detect-kgram-index/ab.py
"""
import sys
import time

from ledger import kgram_index
from service import detection

captured = []
n = {"detect": 0}
orig = {k: getattr(detection, k) for k in ("look_up", "detect")}


def look_up(*a, **k):
    if 20 <= n["detect"] < 24:
        captured.append((a, k))
    return orig["look_up"](*a, **k)


def detect(*a, **k):
    n["detect"] += 1
    out = orig["detect"](*a, **k)
    if n["detect"] == 24:
        best = {True: [], False: []}
        for a2, k2 in captured:
            times = {True: [], False: []}
            for _ in range(9):
                for enabled in (True, False):
                    kgram_index.ENABLED = enabled
                    orig["look_up"](*a2, **k2)
                    t = time.thread_time()
                    for _ in range(40):
                        orig["look_up"](*a2, **k2)
                    times[enabled].append((time.thread_time() - t) / 40)
            for enabled in (True, False):
                best[enabled].append(min(times[enabled]))
        kgram_index.ENABLED = True
        index, probe = (sum(best[e]) / len(best[e]) * 1e3 for e in (True, False))
        print(f"AB look_up index={index:.3f}ms probe={probe:.3f}ms ratio={index / probe:.3f} "
              f"load {open('/proc/loadavg').read().split()[:3]}", flush=True)
    return out


detection.look_up = look_up
detection.detect = detect
from bench import detect_profile  # noqa: E402

sys.argv = ["detect_profile", "--route", "--tier", "expert", "--distinct", "--repeats", "40"]
detect_profile.main()
