"""A FULL `/v1/detect` request against one tenant's 1 to 10,000 keys: in process through
`service.detection.detect` (the plain function the route calls) and over HTTP (a `hallmark
serve` process, one client, one request at a time).

    .venv/bin/python -m bench.detect_request [--keys 1,10,100,1000,10000] [--repeats 5]
                                             [--out bench/results/detect-request.json]

The stores are bench.multikey's (one tenant ``acme`` with K keys of one spec, SQLite under
--store-dir, made once), the texts too: 1,000 token ids null, watermarked under one of the K
keys, and edited (20 % substituted), drawn from the bundled tokenizer's vocabulary. Each
request is everything the route does: rate limit, key scope, the batched detector over every
key with spans and Tr-GoF, the exact-copy look-up (the text decoded and hashed), the k-gram
basis, the signed report. Figures: the median wall ms (and CPU ms in process) of warm
requests, and ``cold_ms``: the first request after the key cache is cleared (every key's
secret unwrapped and its KeySet built), minus a warm request's ms, per key.

These stores hold no generation: the k-gram basis is then one count query (keys with no
finished generation are neither hashed nor queried, keys.kgrams.KgramCache.prefetch). A key
with generations costs a keyed hash of the text's k-grams and one look-up under that key
(the digest scheme is per key); ``kgram_ms_per_key_with_generations`` measures that part
for one key, the figure a tenant whose every key has generations pays per key.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench import multikey  # noqa: E402
from bench.gateway import Gateway  # noqa: E402


def _timed(fn, repeats: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", default="1,10,100,1000,10000")
    parser.add_argument("--algorithm", default="dual_key_gumbel", choices=sorted(multikey.SPECS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--store-dir", default="var/bench-multikey")
    parser.add_argument("--out", default="bench/results/detect-request.json")
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from keys import kgrams
    from keys.tokens import issue_token
    from service import detection
    from service.app import create_app
    from service.auth import authenticate
    from service.schemas import DetectBody
    from service.settings import ServiceSettings

    Path(args.store_dir).mkdir(parents=True, exist_ok=True)
    spec = multikey.SPECS[args.algorithm]
    rows = []
    for count in [int(k) for k in args.keys.split(",")]:
        path = Path(args.store_dir) / f"{args.algorithm}-{count}.db"
        store = multikey._store(path, count, spec)
        with store.transaction() as session:
            token = issue_token(session, tenant="acme", actor="bench").raw_token
        store.engine.dispose()
        store_settings = multikey_store_settings(path)
        settings = ServiceSettings(detect_rate_per_minute=1e9, detect_burst=1_000_000_000)
        app = create_app(settings, store_settings=store_settings)
        row: dict = {"keys": count, "algorithm": args.algorithm, "tokens": multikey.TOKENS, "texts": {}}
        with TestClient(app):
            services = app.state.services
            vocab = len(services.engine.tokenizer())
            multikey.VOCAB = min(multikey.VOCAB, vocab)
            identity = authenticate(services, f"Bearer {token}")
            candidates = services.detection_candidates("acme")
            owner = candidates[count // 2].key
            rng = np.random.default_rng(count)
            marked = multikey.watermarked(owner, multikey.TOKENS, rng)
            texts = {"null": rng.integers(0, multikey.VOCAB, multikey.TOKENS).tolist(), "watermarked": marked,
                     "edited": [int(rng.integers(0, multikey.VOCAB)) if rng.random() < 0.2 else t for t in marked]}
            for name, tokens in texts.items():
                body = DetectBody(token_ids=tokens)
                detection.detect(services, identity, body)  # compiles, fills the caches
                warm_ms, warm_cpu = _timed(lambda: detection.detect(services, identity, body), args.repeats)

                def cold():
                    services.key_cache.clear()
                    detection.detect(services, identity, body)

                cold_ms, _ = _timed(cold, max(1, args.repeats // 2))
                out = detection.detect(services, identity, body)
                row["texts"][name] = {"in_process_ms": round(warm_ms, 3), "in_process_cpu_ms": round(warm_cpu, 3),
                                      "cold_ms": round(cold_ms, 3),
                                      "opening_ms_per_key": round(max(0.0, cold_ms - warm_ms) / count, 5),
                                      "watermarked": out["watermarked"], "log10_p": out["log10_p_value"],
                                      "keys_tested": len(out["per_key"])}
            digest_ms, _ = _timed(lambda: kgrams.position_digests(texts["null"], owner.secret), args.repeats)
            row["kgram_ms_per_key_with_generations"] = round(digest_ms, 3)
        # Over HTTP: a gateway process on the same store.
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "HALLMARK_DATABASE_URL": store_settings.database_url,
                   "HALLMARK_KEK": store_settings.kek.get_secret_value(),
                   "HALLMARK_DETECT_RATE_PER_MINUTE": "1e9", "HALLMARK_DETECT_BURST": "1000000000"}
            server = Gateway(env, Path(tmp) / "gateway.log")
            try:
                server.wait_ready()
                with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=120) as client:
                    for name, tokens in texts.items():
                        client.post("/v1/detect", json={"token_ids": tokens}).raise_for_status()
                        http_ms, _ = _timed(lambda: client.post("/v1/detect", json={"token_ids": tokens})
                                            .raise_for_status(), args.repeats)
                        row["texts"][name]["http_ms"] = round(http_ms, 3)
            finally:
                server.stop(30)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"command": "python -m bench.detect_request " + " ".join(sys.argv[1:]),
           "load_average_at_end": os.getloadavg(), "machine_cores": os.cpu_count(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


def multikey_store_settings(path: Path):
    """The settings bench.multikey's stores are opened with (its fixed benchmark KEK)."""
    import base64

    from pydantic import SecretStr

    from keys.settings import StoreSettings

    return StoreSettings(database_url=f"sqlite:///{path}",
                         kek=SecretStr(base64.b64encode(bytes(range(1, 33))).decode()))


if __name__ == "__main__":
    main()
