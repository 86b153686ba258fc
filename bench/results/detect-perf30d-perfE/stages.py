"""Stage timers around bench.detect_profile: look_up, _ledger_basis, detect; mean CPU
(process_time) and median wall (perf_counter) per call, first SKIP calls left out."""
import atexit, sys, time, os, statistics
from service import detection
SKIP = int(os.environ.get("SKIP", "8"))
acc = {}
def wrap(name):
    f = getattr(detection, name)
    acc[name] = [0, [], []]
    def w(*a, **k):
        t, c0 = time.perf_counter(), time.process_time()
        try:
            return f(*a, **k)
        finally:
            c = acc[name]
            c[0] += 1
            if c[0] > SKIP:
                c[1].append(time.process_time() - c0); c[2].append(time.perf_counter() - t)
    setattr(detection, name, w)
for n in ("look_up", "_ledger_basis", "detect"):
    wrap(n)
@atexit.register
def out():
    print("STAGES", " ".join(f"{n}: cpu-mean {statistics.mean(v[1])*1e3:.3f} wall-median {statistics.median(v[2])*1e3:.3f} |" for n, v in acc.items()), "load", open("/proc/loadavg").read().split()[:3])
from bench import detect_profile
sys.argv = ["detect_profile"] + sys.argv[1:]
detect_profile.main()
