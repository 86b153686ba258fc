import os, sys, time, statistics, pickle, unicodedata
sys.path.insert(0, os.getcwd())
from detector import normalize as N
from detector.forms import text_forms
texts = pickle.load(open("/tmp/route30/texts.pkl", "rb"))
def t(label, fn, passes=15):
    out = []
    for _ in range(passes):
        s = time.thread_time()
        for x in texts: fn(x)
        out.append((time.thread_time() - s) / len(texts))
    print(f"{label:30s} {statistics.median(out)*1e6:.1f} us (min {min(out)*1e6:.1f})")
t("text_forms", text_forms)
t("normalize_forms", N.normalize_forms)
t("_before_collapse", N._before_collapse)
t("hidden search", N._HIDDEN_RUN.search)
t("is_normalized", lambda x: unicodedata.is_normalized("NFKC", x))
t("posing", N._posing_as_latin)
t("linebreak", N._LINE_BREAK.search)
t("tuple(range)", lambda x: tuple(range(len(x))))
t("collapsed", lambda x: N._collapsed(x, range(len(x)), {}, len(x)))
t("spaced words", lambda x: __import__("detector.forms").forms.SPACED_WORDS.search(x))
print(statistics.mean(len(x) for x in texts))
