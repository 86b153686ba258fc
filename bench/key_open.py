"""Opening a scope's keys as the service does, per key: cold, and the key cache's reloads.

    .venv/bin/python -m bench.key_open [--keys 1000,10000] [--specs deterministic,diverse]
                                       [--out bench/results/key-open.json]

One tenant with K stored keys of one spec, in bench.multikey's SQLite stores (made once under
--store-dir): ``deterministic`` (a dual key, bench.multikey's and bench.detect_request's keys)
or ``diverse`` (a dual key in the mode every new key gets: 16 salted candidates a key).
Figures, CPU time of this process (the box is shared), medians of --repeats, ms per stored key:

* ``cold``: what a request after a cleared key cache paid before incremental reloads, and
  what the first request pays: every row read, every secret unwrapped (AES-GCM) and checked
  (HMAC), a diverse key's 16 salted candidates derived (3 x 16 SHA-256), the KeySet built;
* ``reload_unchanged``: the key cache entry expired (every ``key_cache_seconds``) and no row
  changed: rows read and compared, the same candidate list and KeySet given back;
* ``reload_one_revoked``: one key revoked since: that key reopened, the list and KeySet rebuilt;
* ``floor``: the per-key primitives measured alone (one AES-GCM decrypt with `cryptography`,
  one HMAC-SHA256 check value, the 48 SHA-256s of a diverse key's salted candidates).

Run against a tree without ``service.key_scopes`` (main before incremental reloads), only
``cold`` is measured, through that tree's own functions.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench import multikey  # noqa: E402
from detector.multikey import KeySet  # noqa: E402
from detector.result import salted_candidates  # noqa: E402
from keys.material import detection_keys  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

try:
    from service.key_scopes import KeyScopes, candidate_of
except ImportError:  # a tree before incremental reloads
    from service.state import candidate_of
    KeyScopes = None

SPECS = {"deterministic": WatermarkSpec(algorithm="dual_key_gumbel"),
         "diverse": WatermarkSpec(algorithm="dual_key_gumbel", mode="diverse")}


def _cpu_ms(fn, repeats: int, before=None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def _cold(store):
    with store.transaction(write=False) as session:
        candidates = salted_candidates([candidate_of(k) for k in detection_keys(session, store.keyring, tenant="acme")])
    return KeySet.of(candidates)


def _floor(repeats: int = 20_000) -> dict:
    import hmac
    import secrets

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from watermark.key import WatermarkKey

    aead, nonce, ad = AESGCM(secrets.token_bytes(32)), secrets.token_bytes(12), b"x" * 64
    sealed = aead.encrypt(nonce, b"12345678", ad)
    key = WatermarkKey(secrets.randbits(64), SPECS["diverse"])

    def per_call_us(fn, n=repeats):
        start = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - start) / n * 1e6

    out = {"aes_gcm_decrypt_us": round(per_call_us(lambda: aead.decrypt(nonce, sealed, ad)), 3),
           "hmac_check_value_us": round(per_call_us(lambda: hmac.digest(b"12345678", b"label", "sha256")), 3)}
    if hasattr(key, "salted_keys"):  # the 16 salted keys with key A and B: 48 SHA-256s and 16 objects
        out["diverse_salted_keys_us"] = round(per_call_us(key.salted_keys, repeats // 10), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", default="1000,10000")
    parser.add_argument("--specs", default="deterministic,diverse")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--store-dir", default="var/bench-multikey")
    parser.add_argument("--out", default="bench/results/key-open.json")
    args = parser.parse_args()
    Path(args.store_dir).mkdir(parents=True, exist_ok=True)
    # As a gateway runs after its start (service.app): what was loaded frozen, fewer collections.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    rows = []
    for name in args.specs.split(","):
        for count in [int(k) for k in args.keys.split(",")]:
            store = multikey._store(Path(args.store_dir) / f"{name}-{count}.db", count, SPECS[name])
            _cold(store)  # SQLAlchemy compiles its statement once
            row = {"spec": name, "keys": count,
                   "cold_ms_per_key": round(_cpu_ms(lambda: _cold(store), args.repeats) / count, 5)}
            if KeyScopes is not None:
                from keys.lifecycle import list_keys, revoke_key

                scopes = KeyScopes()
                keysets = {}

                def reload():
                    # The service's path: the scope's list, and its KeySet built once per list.
                    candidates = scopes.load(store, "acme")
                    if keysets.get("list") is not candidates:
                        keysets["list"], keysets["keyset"] = candidates, KeySet.of(candidates)

                reload()
                row["reload_unchanged_ms_per_key"] = round(_cpu_ms(reload, args.repeats) / count, 5)

                def revoke_one():
                    with store.transaction() as session:
                        victim = next(k for k in list_keys(session, tenant="acme") if k.state != "revoked")
                        revoke_key(session, key_id=victim.key_id, reason="bench", actor="bench")

                row["reload_one_revoked_ms_per_key"] = round(
                    _cpu_ms(reload, min(args.repeats, 3), before=revoke_one) / count, 5)
            rows.append(row)
            print(json.dumps(row), flush=True)
            store.engine.dispose()
    out = {"command": "python -m bench.key_open " + " ".join(sys.argv[1:]),
           "load_average_at_end": os.getloadavg(), "floor": _floor(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["floor"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
