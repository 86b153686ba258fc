"""How fast a running gateway answers while PostgreSQL drops every packet, and how fast it
recovers (issue 35 item 3: keys/breaker.py). The stack is the test suite's
(tests/service/store_stack.py: the separated service role, through a proxy that stops
forwarding without closing anything).

    python bench/db_outage.py [--rounds 5] [--out bench/results/db-outage.jsonl]

Per round: one generation while the database answers; then the proxy drops everything and
the same five requests are sent in turn, twice (generate, detect, /readyz, list generations,
streamed generate), each timed from send to answer; then the proxy forwards again and the
time until a generation succeeds is measured. One row per round: the first request's time
(it may be waiting on the database when the cut comes: the breaker's probe decides within
about 0.75 s), the slowest of the rest, every status, and the recovery time.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rows import emit  # noqa: E402

CALLS = [("POST", "/v1/generate", {"prompt": "The", "max_tokens": 4}), ("POST", "/v1/detect", {"text": "hello"}),
         ("GET", "/readyz", None), ("GET", "/v1/generations", None),
         ("POST", "/v1/generate", {"prompt": "The", "max_tokens": 4, "stream": True})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    import httpx

    from tests.keys.conftest import reachable_pg_server
    from tests.service import store_stack

    server = reachable_pg_server()
    stack = store_stack.start(server, Path(tempfile.mkdtemp()))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    try:
        for round_ in range(args.rounds):
            def call(method, path, body):
                started = time.monotonic()
                response = httpx.request(method, stack.url + path, json=body, headers=stack.headers(), timeout=60)
                return time.monotonic() - started, response.status_code

            assert call(*CALLS[0])[1] == 200
            stack.proxy.drop()
            timed = [call(*c) for c in CALLS * 2]
            stack.proxy.restore()
            back = time.monotonic()
            while call(*CALLS[0])[1] != 200:
                time.sleep(0.05)
            emit({"bench": "db_outage", "commit": commit, "round": round_, "first_s": round(timed[0][0], 3),
                  "rest_max_s": round(max(t for t, _ in timed[1:]), 3),
                  "statuses": [s for _, s in timed], "recovery_s": round(time.monotonic() - back, 3),
                  "machine": "shared 2-core box, loaded by other work",
                  "command": "python bench/db_outage.py " + " ".join(sys.argv[1:])}, args.out)
    finally:
        stack.stop()
        server.close()


if __name__ == "__main__":
    main()
