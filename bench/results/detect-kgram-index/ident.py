import sys, json, re
from service import detection
outs = []
orig = detection.detect
def detect(services, identity, body, *a, **k):
    out = orig(services, identity, body, *a, **k)
    outs.append(out)
    if len(outs) <= 4:  # the exact texts again: as the tenant? as token ids, and unbatched
        from service.schemas import DetectBody
        outs.append(orig(services, identity, body, *a, batched=False, **k))
    return out
detection.detect = detect
from bench import detect_profile
sys.argv = ["detect_profile", "--route", "--tier", "expert", "--distinct", "--repeats", "40"]
detect_profile.main()
ids = {}
def norm(v, key=None):
    if isinstance(v, dict):
        return {k: norm(x, k) for k, x in v.items() if k not in ("report", "created_at", "updated_at", "entry_hash", "seq")}
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{32}|key_[0-9a-f]{16}", v):
        return ids.setdefault(v, f"id{len(ids)}")
    return v
json.dump([norm(o) for o in outs], open(sys.argv_out if False else "/tmp/kgram30/ident_" + __import__("os").environ["TAG"] + ".json", "w"), indent=1, sort_keys=True)
print("dumped", len(outs))
