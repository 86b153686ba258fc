import json, sys, re
def norm(v, vals, path=""):
    if isinstance(v, dict):
        return {k: norm(x, vals, path + "/" + k) for k, x in v.items()}
    if isinstance(v, list):
        return [norm(x, vals, path + "[]") for x in v]
    return v
def flat(v, path="", out=None):
    out = {} if out is None else out
    if isinstance(v, dict):
        for k, x in v.items(): flat(x, path + "/" + k, out)
    elif isinstance(v, list):
        for i, x in enumerate(v): flat(x, f"{path}[{i}]", out)
    else:
        if isinstance(v, str):
            v = re.sub(r"[0-9a-f]{32}", "G", re.sub(r"key_[0-9a-f]{16}", "K", v))
        out[path] = v
    return out
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
ignore = re.compile(sys.argv[3] if len(sys.argv) > 3 else r'created_at|entry_hash|/signature/')
assert len(a) == len(b), (len(a), len(b))
diffs = {}
for i, (x, y) in enumerate(zip(a, b)):
    fx, fy = flat(x), flat(y)
    for k in set(fx) | set(fy):
        if ignore and ignore.search(k): continue
        if fx.get(k, "<missing>") != fy.get(k, "<missing>"):
            gk = re.sub(r"\[\d+\]", "[]", k)
            diffs.setdefault(gk, []).append((i, fx.get(k, "<missing>"), fy.get(k, "<missing>")))
for k, v in sorted(diffs.items()):
    print(len(v), k, str(v[0])[:200])
print("records", len(a), "differing paths", len(diffs))
