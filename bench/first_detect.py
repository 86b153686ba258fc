"""The first `/v1/detect` after a gateway starts, with numba's on-disk cache empty (as after
an install): issue 30 item 3 (it took 6.1 s, and the README's `httpx` call timed out).

    .venv/bin/python -m bench.first_detect [--repeats 5] [--out bench/results/first-detect.json]

Each round: a fresh store (one tenant, the default new key: `diverse`), a fresh
``NUMBA_CACHE_DIR``, `hallmark serve` started and polled until /readyz answers (the
warm-up runs before it can), then one generation (200 tokens, recorded) and its text with
three words changed, detected first (the first detection), then 2 more distinct texts (the probe guard allows a text family 3 checks a day).
Figures: seconds to ready, the first detection's wall ms, the median of the next 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench import edited
from bench.gateway import Gateway, provision_store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/first-detect.json")
    args = parser.parse_args()
    from keys.lifecycle import build_spec, import_key
    from keys.tenants import create_tenant
    from keys.tokens import issue_token

    def populate(session, keyring):
        create_tenant(session, name="bench", actor="bench")
        import_key(session, keyring, tenant="bench", secret=0x5EED_1234_ABCD_0042, actor="bench", spec=build_spec())
        return {"tenant": issue_token(session, tenant="bench", actor="bench").raw_token}

    rounds = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            env, tokens = provision_store(Path(tmp), populate)
            env = {**os.environ, **env, "NUMBA_CACHE_DIR": str(Path(tmp) / "numba")}
            started = time.perf_counter()
            server = Gateway(env, Path(tmp) / "gateway.log")
            try:
                server.wait_ready()
                ready_s = time.perf_counter() - started
                headers = {"Authorization": f"Bearer {tokens['tenant']}"}
                out = httpx.post(server.url + "/v1/generate", headers=headers, timeout=300,
                                 json={"prompt": "This module provides", "max_tokens": 200, "seed": 1}).json()
                texts = edited.variants([out["text"]], 3)  # a text family may be checked 3 times a day
                times = []
                for text in texts:
                    t = time.perf_counter()
                    r = httpx.post(server.url + "/v1/detect", headers=headers, json={"text": text}, timeout=60)
                    times.append((time.perf_counter() - t) * 1e3)
                    r.raise_for_status()
            finally:
                server.stop(30)
            rounds.append({"ready_s": round(ready_s, 2), "first_ms": round(times[0], 1),
                           "next_median_ms": round(statistics.median(times[1:]), 1), "load_1min": os.getloadavg()[0]})
            print(rounds[-1], flush=True)
    result = {"command": "python -m bench.first_detect --repeats " + str(args.repeats), "rounds": rounds,
              "first_ms_median": statistics.median(r["first_ms"] for r in rounds)}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
