"""The k-gram index's build time and size: a fresh SQLite store with G generations of T
tokens (G x (T - 7) scheme 2 k-grams, recorded through ledger.entries as the gateway does, in
batches), then (1) the first look-up's statement with ``covered`` 0 (every logged finished
entry's rows: what a process reads once, at start or on its first detection), (2) the
index's sort of them, (3) a warm look-up's index search for one 200-token text, and the
arrays' bytes.

    PYTHONPATH=. nice -n 5 .venv/bin/python bench/results/detect-kgram-index/build_time.py [G] [T]
"""
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from pydantic import SecretStr
from sqlalchemy import create_engine

from keys import migrate
from keys.db import open_store
from keys.kek import Kek
from keys.lifecycle import create_key
from keys.material import active_key
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from ledger import kgram_index, kgrams
from ledger.entries import record_generation
from ledger.kgram_cache import _READ_ALL, _with_index
from ledger.log import tlog
from ledger.read import driver_rows

G = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
T = int(sys.argv[2]) if len(sys.argv) > 2 else 207
tmp = Path(tempfile.mkdtemp())
url = f"sqlite:///{tmp / 'h.db'}"
engine = create_engine(url)
migrate.upgrade(engine)
engine.dispose()
kek = Kek.generate()
store = open_store(StoreSettings(database_url=url, kek=SecretStr(kek.to_base64())), require_kek=True)
with store.transaction() as session:
    tenant = create_tenant(session, name="acme", actor="bench")
    create_key(session, store.keyring, tenant="acme", actor="bench")
with store.transaction(write=False) as session:
    key = active_key(session, store.keyring, tenant_id=tenant.id)
rng = random.Random(1)
t0 = time.perf_counter()
texts = []
for batch in range(0, G, 250):
    with store.transaction() as session:
        for _ in range(min(250, G - batch)):
            tokens = [rng.randrange(50_000) for _ in range(T)]
            texts.append(tokens)
            record_generation(session, tenant_id=tenant.id, key_id=key.key_id, key_version=key.version,
                              engine="local", model="tiny", spec=key.spec, prompt_tokens=3,
                              watermarked_tokens=T, unwatermarked_reason=None, output_text="x", token_ids=tokens,
                              kgram_set=kgrams.kgram_set(key.key_id, key.material.secret, tokens))
print(f"populated {G} generations x {T} tokens in {time.perf_counter() - t0:.1f} s")
with store.transaction(write=False) as session:
    n = session.connection().exec_driver_sql("SELECT count(*) FROM ledger_kgrams").scalar()
    store_key = tlog.required_authority(session).kgram_key
print(f"ledger_kgrams rows: {n}")
for attempt in range(3):
    kgram_index.forget_indexes()
    index = kgram_index.index_of(store, store_key)
    snapshot = index.snapshot()
    query = np.unique(np.asarray(kgrams.keyed_position_digests(texts[7][:200], store_key), np.int64))
    values = {"digests": "[" + ",".join(map(str, query.tolist())) + "]", "exact": "[]", "known": "[]",
              "min_matches": 2, "output_sha256": None, "covered": 0, "cand": "[]", "near": "[]"}
    with store.transaction(write=False) as session:
        cpu, wall = time.process_time(), time.perf_counter()
        rows = driver_rows(session.connection(), _READ_ALL["sqlite", False, True], values)
        read_cpu, read_wall = time.process_time() - cpu, time.perf_counter() - wall
        cpu = time.process_time()
        _, indexed = _with_index(session, index, snapshot, kgram_index.find(snapshot, query, None, 2), rows,
                                 query, None)
        build_cpu = time.process_time() - cpu
    built = index.snapshot()
    assert indexed is not None and built.size == n, (built.size, n)
    cpu = time.process_time()
    for _ in range(200):
        found = kgram_index.find(built, query, None, 2)
    find_us = (time.process_time() - cpu) / 200 * 1e6
    assert len(found.candidates) == 1
    arrays = built.nbytes
    print(f"run {attempt + 1}: statement {read_cpu:.3f} s CPU ({read_wall:.3f} s wall), {len(rows)} rows; "
          f"index from them {build_cpu:.3f} s CPU; arrays {arrays / n:.1f} bytes/k-gram ({arrays / 2**20:.1f} MiB); "
          f"look-up of one 200-token text {find_us:.0f} us")
store.close()
