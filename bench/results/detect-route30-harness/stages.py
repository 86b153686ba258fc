"""Per-stage thread CPU of the route bench, without a profiler: wrap named functions.
STAGES=inner (the run the md calls stages2.py): only the tokenising stages inside the route,
fewer wrappers."""
import collections, functools, os, sys, time, importlib
T = collections.defaultdict(float); N = collections.Counter()
def wrap(modname, attr, label, also=()):
    mod = importlib.import_module(modname)
    obj = mod
    parts = attr.split(".")
    for p in parts[:-1]:
        obj = getattr(obj, p)
    fn = getattr(obj, parts[-1])
    @functools.wraps(fn)
    def w(*a, **k):
        t = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            T[label] += time.thread_time() - t; N[label] += 1
    setattr(obj, parts[-1], w)
    for m in also:
        mm = importlib.import_module(m)
        if getattr(mm, parts[-1], None) is fn:
            setattr(mm, parts[-1], w)
TARGETS = [
 ("service.detection", "detect", "detect (all)", ["service.access.gate"]),
 ("service.detection", "Tokenised.forms", "text_forms", []),
 ("service.detection", "tokenize_with_offsets", "tokenise", []),
 ("service.detection", "with_runs_merged", "with_runs_merged", []),
 ("service.detection", "look_up", "ledger look-up", []),
 ("service.detection", "narrowed_by_ledger", "narrowed", []),
 ("service.detection", "detect_forms", "detect_forms", []),
 ("service.detection", "with_span_chars", "with_span_chars", []),
 ("service.detection", "_ledger_basis", "ledger basis", []),
 ("service.detection", "with_ledger_basis", "with_ledger_basis", []),
 ("service.detection", "report_statement", "report_statement", []),
 ("service.detection", "report_scope", "report_scope", []),
 ("service.state", "Services.sign", "sign", []),
 ("detector.result", "DetectionResult.to_dict", "to_dict", []),
 ("starlette.responses", "JSONResponse.render", "json render", []),
 ("service.access.gate", "answer", "gate.answer", []),
 ("service.routes.detect", "_answer", "route _answer", []),
]
if os.environ.get("STAGES") == "inner":
    TARGETS = [TARGETS[0], TARGETS[3],
               ("detector.forms", "merge_space_runs", "merge_space_runs", []),
               ("service.detection", "Tokenised.encode", "Tokenised.encode", []),
               ("service.detection", "Tokenised.forms", "text_forms", [])]
def install():
    for m, a, l, also in TARGETS:
        wrap(m, a, l, also)
install()
import atexit
def report():
    n = N["route _answer"] or N["detect (all)"]
    print("| stage | calls/req | ms/req |")
    for m, a, l, _ in TARGETS:
        if N[l]:
            print(f"| {l} | {N[l]/n:.2f} | {T[l]/n*1e3:.3f} |")
atexit.register(report)
sys.argv = ["bench.detect_profile"] + sys.argv[1:]
from bench import detect_profile
detect_profile.main()
