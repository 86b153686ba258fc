"""The irreducible pieces of one `/v1/detect` request over HTTP in one process, measured on
this machine (issue 30 item 5): what the 2.5x goal leaves for everything else.

    .venv/bin/python -m bench.detect_floor [--seconds 10] [--repeats 2000] [--out FILE]

The goal: one process answering >= 2.5x the 493e3ef code's 576-624 req/s, so 1,440-1,560
req/s, which is ~0.65 ms of server CPU a request (one core). The pieces, each alone:

- ``http_post_floor``: an HTTP/1.1 keep-alive POST of a detection body (a 200-token text, a
  distinct one each request) through uvicorn (httptools, uvloop: what `hallmark serve` runs),
  read, ``json.loads`` and :class:`service.schemas.DetectBody` validation, and a small JSON
  answer: no auth, no middleware, no work. Driven by bench.detect_http's client (16
  connections); the figure is the server's CPU (user + system) per request, with its req/s
  and the client's CPU per request beside it (the client shares the machine).
- ``tokenize``: one encode of a 200-token text: the tokenizers library's own
  (``Tokenizer.encode``, ids and offsets) and service.tokenization.encode_with_offsets.
- ``ledger_sql``: the SQL statements one warm detection of a distinct text sends to the ledger
  (captured from service.detection.detect, BEGIN/COMMIT left out), replayed with SQLite's
  driver alone (``sqlite3``: no ORM, no SQLAlchemy), every row fetched.
- ``audit_insert``: the audit INSERT an expert request writes (captured from the route),
  replayed alone in a transaction that is rolled back (no fsync: the gateway commits the
  events of the requests in flight together), and with its commit (one row, one fsync).
- not asked, for scale: the report's signature (service.state.Services.sign of one report
  statement) and ``json.dumps`` of one full answer.

The SQL and the signature come from a gateway made in process over a fresh SQLite store with
the benchmark's imported dual-key key, and its own generations (as bench.detect_profile).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench import detect_setup, edited  # noqa: E402
from bench.gateway import REPO, free_port  # noqa: E402

TARGET_MS = 0.65
"""Server CPU a request at the goal: 1 s / (2.5 x ~600 req/s) in one process."""


# --- the HTTP floor's server: `python -m uvicorn bench.detect_floor:app` -------------------------

async def app(scope, receive, send):
    """A bare ASGI app: POST reads its body, parses and validates it as a detection body, and
    answers a small JSON object; anything else 404."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    from service.schemas import DetectBody

    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    status, answer = 404, b'{"detail":"not found"}'
    if scope["method"] == "POST":
        body = DetectBody.model_validate(json.loads(b"".join(chunks)))
        status, answer = 200, json.dumps({"watermarked": False, "chars": len(body.text or "")}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


def _cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def http_post_floor(texts: list[str], seconds: float, clients: int) -> dict:
    from bench.detect_http import _load

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "bench.detect_floor:app", "--port", str(port),
                               "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"],
                              cwd=REPO, env=env)
    try:
        import httpx

        for _ in range(200):
            try:
                if httpx.post(f"http://127.0.0.1:{port}/v1/detect", json={"text": "x"}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        bodies = [{"text": t} for t in edited.variants(texts, 200_000)]
        asyncio.run(_load(port, "floor", bodies[:20_000], clients, 2.0, 0.0))  # warm-up
        server_cpu, client_cpu = _cpu(server.pid), time.process_time()
        latencies, errors = asyncio.run(_load(port, "floor", bodies[20_000:], clients, seconds, 0.0))
        server_cpu, client_cpu = _cpu(server.pid) - server_cpu, time.process_time() - client_cpu
    finally:
        server.terminate()
        server.wait(30)
    n = len(latencies)
    if errors:
        raise SystemExit(f"{errors} floor requests were not answered 200")
    return {"requests_per_second": round(n / seconds, 1), "server_cpu_ms_per_request": round(server_cpu / n * 1e3, 4),
            "client_cpu_ms_per_request": round(client_cpu / n * 1e3, 4),
            "p50_ms": round(statistics.median(latencies) * 1e3, 2), "clients": clients}


def _per_call_ms(fn, items: list, repeats: int) -> float:
    """Median over 5 rounds of the CPU ms per call of ``fn`` over ``items`` in turn."""
    rounds = []
    for r in range(5):
        start = time.process_time()
        for i in range(repeats):
            fn(items[(r * repeats + i) % len(items)])
        rounds.append((time.process_time() - start) / repeats)
    return round(statistics.median(rounds) * 1e3, 4)


def in_process(texts_needed: int, repeats: int) -> tuple[list[str], dict]:
    """The generations, and the tokenizer, SQL, audit, signature and JSON pieces."""
    from fastapi.testclient import TestClient
    from sqlalchemy import event

    from bench.gateway import provision_store
    from keys.settings import StoreSettings
    from service import detection
    from service.app import create_app
    from service.auth import authenticate
    from service.routes import detect as detect_route
    from service.schemas import DetectBody
    from service.settings import ServiceSettings
    from service.tokenization import encode_with_offsets

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        env, tokens = provision_store(Path(tmp), detect_setup.populate())
        store_settings = StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=env["HALLMARK_KEK_FILE"])
        settings = ServiceSettings(detect_rate_per_minute=1e9, detect_burst=1_000_000_000)
        app_ = create_app(settings, store_settings=store_settings)
        with TestClient(app_) as client:
            services = app_.state.services
            texts = detect_setup.generated_texts(client, tokens["tenant"], texts_needed)
            variants = edited.variants(texts, 4_000)
            identity = authenticate(services, f"Bearer {tokens['expert']}")
            for text in variants[:8]:  # warm: statements compiled, keys opened
                detection.detect(services, identity, DetectBody(text=text))

            # The tokenizer: one encode of a 200-token text (a distinct one each call).
            backend = services.engine.tokenizer()._tokenizer
            out["tokenize_tokenizers_encode_ms"] = _per_call_ms(
                lambda t: (lambda e: (e.ids, e.offsets))(backend.encode(t, add_special_tokens=False)),
                variants, repeats)
            out["tokenize_encode_with_offsets_ms"] = _per_call_ms(lambda t: encode_with_offsets(backend, t),
                                                                  variants[1000:], repeats)

            # The SQL one warm detection sends, and the audit INSERT of one expert request.
            seen: list[tuple[str, object]] = []
            import threading

            def capture(conn, cursor, statement, parameters, context, executemany):
                # The request's own statements (and its writes' thread's): not the key cache's reloads.
                if threading.current_thread().name != "cache-refresh":
                    seen.append((statement, parameters, executemany))

            # The key cache's entries (keys, signer) loaded just now, so that the captured request
            # reads none of them (its thread reloads them ahead of expiry, not the request).
            detection.detect(services, identity, DetectBody(text=variants[1999]))
            event.listen(services.store.engine, "before_cursor_execute", capture)
            answer = detection.detect(services, identity, DetectBody(text=variants[2000]))
            event.remove(services.store.engine, "before_cursor_execute", capture)
            reads = [s for s in seen if s[0].split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT",
                                                                          "RELEASE")]
            seen.clear()
            event.listen(services.store.engine, "before_cursor_execute", capture)
            loop = asyncio.new_event_loop()
            response = loop.run_until_complete(detect_route._answer(services, identity,
                                                                    DetectBody(text=variants[2001]), None))
            assert response.status_code == 200
            deadline = time.monotonic() + 30
            while not any("INSERT INTO audit" in s[0] for s in seen) and time.monotonic() < deadline:
                time.sleep(0.01)  # the writes' thread commits it after the answer left the lane
            event.remove(services.store.engine, "before_cursor_execute", capture)
            audits = [s for s in seen if s[0].lstrip().upper().startswith("INSERT INTO AUDIT")]
            signature_ms = _per_call_ms(lambda s: services.sign(s), [answer["report"]["statement"]], repeats // 4)
            json_ms = _per_call_ms(lambda a: json.dumps(a, separators=(",", ":")).encode(), [answer], repeats)
            database = env["HALLMARK_DATABASE_URL"].removeprefix("sqlite:///")
        loop.close()

        raw = sqlite3.connect(database, isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")

        def replay_reads(_):
            raw.execute("BEGIN")
            for statement, parameters, many in reads:
                if many:
                    raw.executemany(statement, parameters)
                else:
                    raw.execute(statement, parameters).fetchall()
            raw.execute("ROLLBACK")

        out["ledger_sql_statements"] = len(reads)
        out["ledger_sql_statement_kinds"] = [" ".join(s[0].split())[:70] for s in reads]
        out["ledger_sql_sqlite3_ms"] = _per_call_ms(replay_reads, [None], max(50, repeats // 10))
        if audits:
            statement, parameters, many = audits[0]

            def insert(_):
                raw.execute("BEGIN")
                (raw.executemany if many else raw.execute)(statement, parameters)
                raw.execute("ROLLBACK")

            out["audit_insert_rolled_back_ms"] = _per_call_ms(insert, [None], repeats)
            out["audit_insert_rows"] = len(parameters) if many else 1
            # With its commit: into an empty copy of the table, so that the store's own rows stay as they were.
            table = statement.split()[2]
            raw.execute("DROP TABLE IF EXISTS audit_floor")
            raw.execute(f"CREATE TABLE audit_floor AS SELECT * FROM {table} WHERE 0")
            copy = statement.replace(table, "audit_floor", 1)
            committed = []
            for _ in range(50):
                start_cpu, start_wall = time.process_time(), time.perf_counter()
                raw.execute("BEGIN")
                (raw.executemany if many else raw.execute)(copy, parameters)
                raw.execute("COMMIT")
                committed.append((time.process_time() - start_cpu, time.perf_counter() - start_wall))
            out["audit_insert_committed_cpu_ms"] = round(statistics.median(c for c, _ in committed) * 1e3, 4)
            out["audit_insert_committed_wall_ms"] = round(statistics.median(w for _, w in committed) * 1e3, 4)
        raw.close()
        out["report_signature_ms"] = signature_ms
        out["answer_json_dumps_ms"] = json_ms
        out["answer_json_bytes"] = len(json.dumps(answer, separators=(",", ":")))
    return texts, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--out", default=None, help="append a JSON line with the figures")
    args = parser.parse_args()
    load_before = os.getloadavg()
    texts, pieces = in_process(4, args.repeats)
    http = http_post_floor(texts, args.seconds, args.clients)
    floor = {
        "http_post_floor_server_cpu_ms": http["server_cpu_ms_per_request"],
        "tokenize_one_form_ms": pieces["tokenize_encode_with_offsets_ms"],
        "ledger_sql_sqlite3_ms": pieces["ledger_sql_sqlite3_ms"],
        "audit_insert_ms": pieces.get("audit_insert_rolled_back_ms"),
    }
    total = round(sum(v for v in floor.values() if v is not None), 4)
    row = {"command": "python -m bench.detect_floor " + " ".join(sys.argv[1:]), "http": http, **pieces,
           "floor": floor, "floor_sum_ms": total, "target_ms": TARGET_MS,
           "floor_share_of_target": round(total / TARGET_MS, 3),
           "load_average_before": [round(x, 2) for x in load_before],
           "load_average_after": [round(x, 2) for x in os.getloadavg()], "machine_cores": os.cpu_count()}
    print(json.dumps(row, indent=1))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
