"""Replay captured detect_forms inputs: python replay.py CAP.pkl [time N | prof]"""
import os, sys, pickle, time, statistics
sys.path.insert(0, os.getcwd())
from watermark import jit; jit.load()
from detector.forms import detect_forms
from detector.multikey import detect_many, KeySet
from detector.scoring import ScoreMemo
cap = pickle.load(open(sys.argv[1], "rb"))
ks = {}
items = []
for forms, cands, config, batched in cap:
    k = tuple(id(c) for c in cands)
    items.append((forms, KeySet.of(cands), config))
def one():
    return [detect_forms(f, k, c, run=detect_many, memo=ScoreMemo()) for f, k, c in items]
one()
if sys.argv[2] == "time":
    ts = []
    for _ in range(int(sys.argv[3])):
        s = time.process_time(); one(); ts.append((time.process_time() - s) / len(items))
    print(f"{os.getcwd()} median {statistics.median(ts)*1e3:.3f} ms/request min {min(ts)*1e3:.3f} (n={len(items)})")
elif sys.argv[2] == "dump":
    res = one()
    pickle.dump([(r.__dict__, b) for r, b in res], open(sys.argv[3], "wb"))
else:
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable(); one(); one(); pr.disable()
    pstats.Stats(pr).sort_stats(sys.argv[3] if len(sys.argv) > 3 else "tottime").print_stats(45)
