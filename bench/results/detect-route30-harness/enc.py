import os, sys, pickle, time, statistics
sys.path.insert(0, os.getcwd())
from transformers import AutoTokenizer
from service.tokenization import resolve_model_path, encode_with_offsets
from detector.forms import text_forms
tok = AutoTokenizer.from_pretrained(resolve_model_path("bundled"))
be = tok._tokenizer
texts = pickle.load(open("/tmp/route30/texts.pkl", "rb"))
forms = [f.text for t in texts for f in text_forms(t)[0]]
bad = 0
for f in forms:
    e = be.encode(f, add_special_tokens=False)
    if encode_with_offsets(be, f) != (e.ids, e.offsets): bad += 1
out = []
for _ in range(15):
    s = time.thread_time()
    for f in forms: encode_with_offsets(be, f)
    out.append((time.thread_time() - s) / len(texts))
print(f"{os.getcwd()} encode the forms: {statistics.median(out)*1e6:.1f} us a text (min {min(out)*1e6:.1f}); {len(forms)} forms, {bad} differ from the backend")
