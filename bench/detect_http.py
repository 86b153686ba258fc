"""/v1/detect under load: requests/s and latency percentiles for 200-token texts.

    .venv/bin/python -m bench.detect_http [--clients 16] [--seconds 20]

Starts `hallmark serve` (bundled models, a fresh SQLite store under a temp dir) in its own
process, generates watermarked 200-token texts through /v1/generate, then drives
/v1/detect with ``--clients`` concurrent keep-alive HTTP/1.1 connections (one asyncio
process, a minimal client so that the load generator itself stays cheap) for
``--seconds`` after a warm-up. Client and server share this machine's cores, as they
would behind a local proxy; the figures are end to end (HTTP, auth, tokenisation, key
lookup, exact p-value, spans, ledger lookup, JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.gateway import Gateway, percentile
from keys import migrate
from keys.db import open_store
from keys.kek import generate_kek_file
from keys.lifecycle import create_key
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from keys.tokens import issue_token
from watermark.spec import WatermarkSpec


def _provision(tmp: Path) -> tuple[dict[str, str], str]:
    kek = tmp / "kek.key"
    generate_kek_file(kek)
    env = {"HALLMARK_DATABASE_URL": f"sqlite:///{tmp / 'hallmark.db'}", "HALLMARK_KEK_FILE": str(kek)}
    store = open_store(StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=kek), require_kek=True,
                       check_schema=False, create=True)
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            create_tenant(session, name="bench", actor="bench")
            create_key(session, store.keyring, tenant="bench", actor="bench",
                       spec=WatermarkSpec(algorithm="dual_key_gumbel"))
            token = issue_token(session, tenant="bench", actor="bench").raw_token
    finally:
        store.close()
    return env, token


class _Connection:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: the load generator shares the
    machine with the server, so it must spend as little CPU per request as possible."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length)
        return status, body


def _request(path: str, host: str, token: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload


async def _load(port: int, token: str, bodies: list[dict], clients: int, seconds: float, warmup: float):
    latencies: list[float] = []
    errors = 0
    requests = [_request("/v1/detect", f"127.0.0.1:{port}", token, b) for b in bodies]
    stop_at = time.perf_counter() + warmup + seconds
    measure_from = time.perf_counter() + warmup

    async def worker(i: int) -> None:
        nonlocal errors
        connection = _Connection("127.0.0.1", port)
        await connection.open()
        n = i
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            status, _ = await connection.post(requests[n % len(requests)])
            end = time.perf_counter()
            n += 1
            if status != 200:
                errors += 1
            elif start >= measure_from:
                latencies.append(end - start)
        connection.writer.close()

    await asyncio.gather(*(worker(i) for i in range(clients)))
    return latencies, errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--out", default="bench/results/detect_http.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env, token = _provision(Path(tmp))
        env = {**os.environ, **env, "HALLMARK_DETECT_RATE_PER_MINUTE": "1e9", "HALLMARK_DETECT_BURST": "1000000000"}
        server = Gateway(env, Path(tmp) / "gateway.log")
        port, url = server.port, server.url
        try:
            server.wait_ready()
            headers = {"Authorization": f"Bearer {token}"}
            # Texts of about 200 tokens (generation may stop early at EOS: keep the long ones).
            texts = []
            for seed in range(64):
                out = httpx.post(url + "/v1/generate", headers=headers, timeout=300,
                                 json={"prompt": "This module provides", "max_tokens": 200, "seed": seed}).json()
                if len(out["token_ids"]) >= 190:
                    texts.append(out["text"])
                if len(texts) == 8:
                    break
            bodies = [{"text": t} for t in texts]
            check = httpx.post(url + "/v1/detect", headers=headers, json=bodies[0], timeout=30).json()
            latencies, errors = asyncio.run(_load(port, token, bodies, args.clients, args.seconds, args.warmup))
        finally:
            server.stop(30)
    pct = lambda q: percentile(latencies, q) * 1e3  # noqa: E731
    result = {
        "clients": args.clients, "seconds": args.seconds, "requests": len(latencies), "errors": errors,
        "requests_per_second": len(latencies) / args.seconds, "p50_ms": pct(0.50), "p90_ms": pct(0.90),
        "p99_ms": pct(0.99), "mean_ms": statistics.mean(latencies) * 1e3,
        "text_tokens": check.get("total_tokens"), "sample_log10_p": check.get("log10_p_value"),
        "machine_cores": os.cpu_count(), "command": "python -m bench.detect_http",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"/v1/detect, {args.clients} clients, {result['text_tokens']}-token texts: "
          f"{result['requests_per_second']:.0f} req/s, p50 {result['p50_ms']:.1f} ms, p90 {result['p90_ms']:.1f} ms, "
          f"p99 {result['p99_ms']:.1f} ms, errors {errors}")


if __name__ == "__main__":
    main()
