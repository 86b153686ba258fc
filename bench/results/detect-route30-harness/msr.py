"""merge_space_runs timing on the bench variants: python msr.py [prof]"""
import os, sys, pickle, time, statistics
sys.path.insert(0, os.getcwd())
from transformers import AutoTokenizer
from service.tokenization import resolve_model_path
from service import detection, generation_ids
from detector.segmentation import merge_space_runs
tok = AutoTokenizer.from_pretrained(resolve_model_path("bundled"))
table = generation_ids.segmentation_table(tok, None)
texts = pickle.load(open("/tmp/route30/texts.pkl", "rb"))
enc = lambda s: detection.tokenize_with_offsets(tok, s)[0]
items = [(t, enc(t)) for t in texts]
table.by_id
res = [merge_space_runs(t, c, table, enc) for t, c in items]
if len(sys.argv) > 2:
    pickle.dump(res, open(sys.argv[2], "wb"))
out = []
for _ in range(9):
    s = time.thread_time()
    for t, c in items: merge_space_runs(t, c, table, enc)
    out.append((time.thread_time() - s) / len(items))
print(f"merge_space_runs {statistics.median(out)*1e6:.1f} us (min {min(out)*1e6:.1f})")
if len(sys.argv) > 1 and sys.argv[1] == "prof":
    import cProfile, pstats
    pr = cProfile.Profile(); pr.enable()
    for t, c in items: merge_space_runs(t, c, table, enc)
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(12)
