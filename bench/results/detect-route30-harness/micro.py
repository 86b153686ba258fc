"""Micro timings of request pieces on the bench's distinct texts (thread CPU, median of passes).
usage: cd TREE && python micro.py"""
import os, sys, tempfile, time, statistics
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.getcwd())
from pathlib import Path
from fastapi.testclient import TestClient
from bench import detect_setup, edited
from bench.gateway import provision_store
from keys.settings import StoreSettings
from service.app import create_app
from service.settings import ServiceSettings
from watermark.spec import WatermarkSpec
from service import detection, generation_ids
from detector.forms import TextForm, with_runs_merged, text_forms
from detector.segmentation import merge_space_runs
spec = WatermarkSpec(algorithm="dual_key_gumbel")
def t(label, fn, items, passes=7):
    out = []
    for _ in range(passes):
        s = time.thread_time()
        for x in items:
            fn(x)
        out.append((time.thread_time() - s) / len(items))
    print(f"{label:40s} {statistics.median(out)*1e3:.4f} ms (min {min(out)*1e3:.4f})")
with tempfile.TemporaryDirectory() as tmp:
    env, tokens = provision_store(Path(tmp), detect_setup.populate(spec))
    ss = StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=env["HALLMARK_KEK_FILE"])
    app = create_app(ServiceSettings(), store_settings=ss)
    with TestClient(app) as client:
        services = app.state.services
        texts = detect_setup.generated_texts(client, tokens["tenant"], 4)
        vs = edited.variants(texts, 400)
        tok = services.engine.tokenizer()
        table = generation_ids.segmentation_table(tok, services.engine)
        enc = lambda s: detection.tokenize_with_offsets(tok, s)
        for v in vs: enc(v)  # warm pieces
        t("text_forms", text_forms, vs)
        t("encode (as sent)", enc, vs)
        forms = [text_forms(v)[0] for v in vs]
        t("encode all forms", lambda fs: [enc(f.text) for f in fs], forms)
        firsts = [(v, enc(v)[0]) for v in vs]
        t("merge_space_runs", lambda a: merge_space_runs(a[0], a[1], table, lambda p: enc(p)[0]), firsts)
        print("merged differs:", sum(merge_space_runs(a[0], a[1], table, lambda p: enc(p)[0]) is not None for a in firsts), "of", len(firsts))
        print("forms per text:", statistics.mean(len(f) for f in forms))
        if len(sys.argv) > 1:
            import cProfile, pstats
            pr = cProfile.Profile(); pr.enable()
            for a in firsts: merge_space_runs(a[0], a[1], table, lambda p: enc(p)[0])
            pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(15)
        import pickle; pickle.dump(vs, open("/tmp/route30/texts.pkl", "wb")); pickle.dump(texts, open("/tmp/route30/texts4.pkl", "wb"))
