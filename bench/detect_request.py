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
requests, and ``cold_ms``: the first request after the key cache and the opened keys are
cleared (every key's secret unwrapped and its KeySet built), minus a warm request's ms, per
key (``opening_ms_per_key``, and in CPU time ``opening_cpu_ms_per_key``); ``reload_cpu_ms``:
a request after the key cache's entry expired with no key changed (service.key_scopes).

By default these stores hold no generation. ``--generations N`` records N generations
(200 random token ids each) under EVERY key first, and the watermarked text as the owner's
generation (so the edited text has a k-gram match and the watermarked one an exact copy):
the provider's case, every key with generations, whose k-gram look-ups the request then
pays in full (stores ``<algorithm>-<K>-g<N>.db``, made once). With the per-key k-gram
scheme (scheme 1) that was a keyed hash of the text and one query per key; with the
store's one k-gram key (scheme 2, ledger.kgrams) one of each for every key.
``kgram_ms_per_key_with_generations``: one scheme 1 hashing of the text, for comparison.
``--no-http`` skips the gateway process.

    .venv/bin/python -m bench.detect_request --keys 1,100,1000 --generations 1 --no-http \
        --store-dir var/bench-kgrams --out bench/results/detect-request-kgrams.json
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
    parser.add_argument("--generations", type=int, default=0,
                        help="generations recorded under every key before timing (default 0: none)")
    parser.add_argument("--no-http", action="store_true", help="time the in-process request only")
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from ledger import kgrams
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
        suffix = f"-g{args.generations}" if args.generations else ""
        path = Path(args.store_dir) / f"{args.algorithm}-{count}{suffix}.db"
        store = multikey._store(path, count, spec)
        if args.generations:
            _record_generations(store, args.generations, seed=count)
        with store.transaction() as session:
            token = issue_token(session, tenant="acme", actor="bench").raw_token
            # Over HTTP an expert token: a tenant token's probe guard (service.access) refuses a
            # text's repeated checks, by design; a benchmark is not a probe.
            expert = issue_token(session, tenant=None, actor="bench", expert=True).raw_token
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
            if args.generations:
                _record_owner_text(services, path, candidates[count // 2], marked)
            for name, tokens in texts.items():
                body = DetectBody(token_ids=tokens)
                detection.detect(services, identity, body)  # compiles, fills the caches
                warm_ms, warm_cpu = _timed(lambda: detection.detect(services, identity, body), args.repeats)

                def cold():
                    services.key_cache.clear()
                    services.key_scopes.clear()  # what was opened too: every key opened again
                    detection.detect(services, identity, body)

                def reload():  # the key cache expired, no key changed (service.key_scopes)
                    services.key_cache.clear()
                    detection.detect(services, identity, body)

                cold_ms, cold_cpu = _timed(cold, max(1, args.repeats // 2))
                reload_ms, reload_cpu = _timed(reload, max(1, args.repeats // 2))
                out = detection.detect(services, identity, body)
                row["texts"][name] = {"in_process_ms": round(warm_ms, 3), "in_process_cpu_ms": round(warm_cpu, 3),
                                      "cold_ms": round(cold_ms, 3), "cold_cpu_ms": round(cold_cpu, 3),
                                      "opening_ms_per_key": round(max(0.0, cold_ms - warm_ms) / count, 5),
                                      "opening_cpu_ms_per_key": round(max(0.0, cold_cpu - warm_cpu) / count, 5),
                                      "reload_cpu_ms": round(reload_cpu, 3),
                                      "watermarked": out["watermarked"], "log10_p": out["log10_p_value"],
                                      "keys_tested": len(out["per_key"]),
                                      "ledger_matches": len(out["ledger_matches"]),
                                      "kgram_matches": [(m["matched_kgrams"], m["text_kgrams"], m["generation_kgrams"],
                                                         m["log10_false_match_bound"])
                                                        for m in out["kgram_matches"]]}
            digest_ms, _ = _timed(lambda: kgrams.position_digests(texts["null"], owner.secret), args.repeats)
            row["kgram_ms_per_key_with_generations"] = round(digest_ms, 3)
        # Over HTTP: a gateway process on the same store.
        with tempfile.TemporaryDirectory() as tmp:
            if args.no_http:
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            env = {**os.environ, "HALLMARK_DATABASE_URL": store_settings.database_url,
                   "HALLMARK_KEK": store_settings.kek.get_secret_value(),
                   "HALLMARK_DETECT_RATE_PER_MINUTE": "1e9", "HALLMARK_DETECT_BURST": "1000000000"}
            server = Gateway(env, Path(tmp) / "gateway.log")
            try:
                server.wait_ready()
                with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {expert}"},
                                  timeout=120) as client:
                    for name, tokens in texts.items():
                        body = {"token_ids": tokens, "tenant": "acme"}
                        client.post("/v1/detect", json=body).raise_for_status()
                        http_ms, _ = _timed(lambda: client.post("/v1/detect", json=body).raise_for_status(),
                                            args.repeats)
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


GENERATION_TOKENS = 200


def _record_generations(store, per_key: int, seed: int) -> None:
    """``per_key`` generations of random token ids under every key of the store's tenant, as
    the gateway records them (entry, k-grams, log leaf); once per store."""
    from sqlalchemy import func, select

    from ledger import kgrams
    from ledger.entries import record_generation
    from keys.material import detection_keys
    from keys.models import LedgerEntry

    with store.transaction(write=False) as session:
        if session.scalar(select(func.count()).select_from(LedgerEntry)):
            return
        keys = detection_keys(session, store.keyring, tenant="acme")
    rng = np.random.default_rng(seed + 1)
    for start in range(0, len(keys), 200):
        with store.transaction() as session:
            for i, key in enumerate(keys[start:start + 200]):
                for j in range(per_key):
                    tokens = rng.integers(0, multikey.VOCAB, GENERATION_TOKENS).tolist()
                    record_generation(session, tenant_id=key.tenant_id, key_id=key.key_id, key_version=key.version,
                                      engine="local", model="bench", spec=key.spec, prompt_tokens=3,
                                      watermarked_tokens=len(tokens), unwatermarked_reason=None,
                                      output_text=f"bench {start + i} {j}", token_ids=tokens,
                                      kgram_set=kgrams.kgram_set(key.key_id, key.material.secret, tokens))


def _record_owner_text(services, path: Path, candidate, tokens: list[int]) -> None:
    """The watermarked text as its key's generation (once per store: a marker file beside it)."""
    from ledger import kgrams
    from ledger.entries import record_generation

    marker = path.with_suffix(".owner")
    if marker.exists():
        return
    info = candidate.info
    with services.store.transaction() as session:
        tenant_id = services.tenant_id(info.tenant)
        record_generation(session, tenant_id=tenant_id, key_id=info.key_id, key_version=info.version,
                          engine="local", model="bench", spec=candidate.key.spec, prompt_tokens=3,
                          watermarked_tokens=len(tokens), unwatermarked_reason=None,
                          output_text=services.engine.tokenizer().decode(tokens, skip_special_tokens=True),
                          token_ids=tokens, kgram_set=kgrams.kgram_set(info.key_id, candidate.key.secret, tokens))
    services.key_cache.clear()
    marker.write_text("recorded\n")


def multikey_store_settings(path: Path):
    """The settings bench.multikey's stores are opened with (its fixed benchmark KEK)."""
    import base64

    from pydantic import SecretStr

    from keys.settings import StoreSettings

    return StoreSettings(database_url=f"sqlite:///{path}",
                         kek=SecretStr(base64.b64encode(bytes(range(1, 33))).decode()))


if __name__ == "__main__":
    main()
