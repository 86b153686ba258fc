"""Full /v1/detect answers for the bench texts (+ variants), written as JSON lines.
usage: cd TREE && python golden.py OUT [--spec dual|diverse]"""
import json, os, sys, tempfile
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.getcwd())
from pathlib import Path
out_path = sys.argv[1]
spec_name = sys.argv[2] if len(sys.argv) > 2 else "dual"
from fastapi.testclient import TestClient
from bench import detect_setup, edited
from bench.gateway import provision_store
from keys.lifecycle import build_spec
from keys.settings import StoreSettings
from service.app import create_app
from watermark.spec import WatermarkSpec
spec = WatermarkSpec(algorithm="dual_key_gumbel") if spec_name == "dual" else build_spec()
with tempfile.TemporaryDirectory() as tmp:
    env, tokens = provision_store(Path(tmp), detect_setup.populate(spec))
    ss = StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=env["HALLMARK_KEK_FILE"])
    app = create_app(detect_setup.unthrottled_settings(), store_settings=ss)
    with TestClient(app) as client:
        texts = detect_setup.generated_texts(client, tokens["tenant"], 4)
        vs = edited.variants(texts, 60)
        # normalisation attacks: widened spaces, and a homoglyph-ish
        extra = [t.replace(" the ", "  the ") for t in texts] + [t.replace("e", "\u0435", 3) for t in texts[:2]]
        extra += [t[: len(t) // 3] for t in texts]
        bodies = [{"text": t} for t in texts + vs + extra]
        bodies += [{"text": texts[0], "normalize": False}, {"text": vs[0], "spans": False},
                   {"text": texts[1], "evidence": True}, {"text": vs[1], "statistic": "weighted"},
                   {"text": vs[2], "test": "sum"} ]
        ids = client.post("/v1/generate", headers={"Authorization": f"Bearer {tokens['tenant']}"},
                          json={"prompt": "Hello there", "max_tokens": 120, "seed": 7}).json()["token_ids"]
        bodies += [{"token_ids": ids}, {"token_ids": ids[5:]}]
        with open(out_path, "w") as f:
            for tier in ("expert", "tenant"):
                for b in bodies:
                    r = client.post("/v1/detect", headers={"Authorization": f"Bearer {tokens[tier]}"}, json=b)
                    f.write(json.dumps({"tier": tier, "body": b, "status": r.status_code, "answer": r.json()}) + "\n")
print("wrote", out_path)
