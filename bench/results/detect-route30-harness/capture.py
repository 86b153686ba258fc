"""Capture detect_forms inputs from the route bench: python capture.py OUT.pkl [bench args]"""
import os, sys, pickle
sys.path.insert(0, os.getcwd())
out = sys.argv[1]
from service import detection
from detector.multikey import detect_many
real = detection.detect_forms
seen = []
def cap(forms, keyset, config, run=None, memo=None):
    seen.append(([list(f) for f in forms], list(keyset.candidates) if hasattr(keyset, "candidates") else list(keyset), config, run is detect_many))
    return real(forms, keyset, config, run=run, memo=memo)
detection.detect_forms = cap
import atexit
atexit.register(lambda: pickle.dump(seen, open(out, "wb")))
sys.argv = ["bench.detect_profile"] + sys.argv[2:]
from bench import detect_profile
detect_profile.main()
