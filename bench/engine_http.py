"""The gateway end to end on one GPU: N streaming HTTP clients against the engine alone.

    python bench/engine_http.py --out FILE [--requests 64,256] [--rounds 4] [--tokens 128]
        [--database-url URL]

One process serves the gateway (``create_app`` under uvicorn, its own event loop on a
thread of its own, the ledger on SQLite by default or ``--database-url``, receipts signed:
a store provisioned like the tests' with tenant ``acme``'s dual-key key). Its engine is
the same LocalEngine object the bench drives directly between HTTP rounds, so "engine
alone" and "through HTTP" run the same engine, on the same card, in one run, alternating
round by round. EOS is ignored in both (every request generates exactly ``--tokens``).

The HTTP clients run in a second process (this script with ``--client``), so that the
clients' own parsing does not share the gateway's interpreter: per round, N concurrent
``POST /v1/generate`` with ``"stream": true`` (server-sent events), each from its own
connection; the round's tokens/s is every client's tokens over the time until the last
stream ended (its ``done`` event: the finished entry committed and the receipt signed).
First-token latency: request sent to the first delta that carries tokens.

Also reported: the ledger's writes in the run (entries per generation, groups committed and
their sizes: service.access.group_commit) and every ``done`` event's receipt present.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["The function returns", "Return a new list", "This module provides", "If the argument is"]


# ---------------------------------------------------------------------------------- the clients


async def _client_round(url: str, token: str, n: int, tokens: int, salt: int) -> dict:
    import httpx

    async def one(i: int, client: httpx.AsyncClient) -> dict:
        body = {"prompt": PROMPTS[i % 4], "max_tokens": tokens, "seed": 1000 * salt + i, "stream": True}
        sent = time.perf_counter()
        first, got, receipt, error = None, 0, False, None
        async with client.stream("POST", url + "/v1/generate", json=body,
                                 headers={"Authorization": f"Bearer {token}"}) as response:
            if response.status_code != 200:
                return {"error": f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event["type"] == "delta" and event["token_ids"]:
                    got += len(event["token_ids"])
                    if first is None:
                        first = time.perf_counter() - sent
                elif event["type"] == "done":
                    receipt = event.get("receipt") is not None
                elif event["type"] == "error":
                    error = event.get("message") or str(event)
        return {"tokens": got, "first_token_s": first, "end_s": time.perf_counter() - sent, "receipt": receipt,
                "error": error}

    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(i, client) for i in range(n)))
        seconds = time.perf_counter() - start
    ok = [r for r in results if not r.get("error")]
    total = sum(r["tokens"] for r in ok)
    firsts = [r["first_token_s"] for r in ok if r["first_token_s"] is not None]
    return {"requests": n, "ok": len(ok), "errors": [r["error"] for r in results if r.get("error")][:3],
            "tokens": total, "seconds": round(seconds, 4), "tokens_per_second": round(total / seconds, 1),
            "receipts": sum(r["receipt"] for r in ok), "first_token_s": firsts}


def client_main(url: str, token: str) -> None:
    """Rounds on request: each stdin line ``N TOKENS SALT`` runs one round, one JSON line out."""
    for line in sys.stdin:
        n, tokens, salt = (int(x) for x in line.split())
        print(json.dumps(asyncio.run(_client_round(url, token, n, tokens, salt))), flush=True)


# ---------------------------------------------------------------------------------- the gateway


def _percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4) if ordered else None


async def _engine_round(engine, n: int, tokens: int, salt: int) -> dict:
    from service.engines.base import Finished, GenerationRequest, WatermarkPlan
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    tok = engine.tokenizer()
    requests = []
    for i in range(n):
        key = WatermarkKey(0xC0FFEE + i, WatermarkSpec(algorithm="dual_key_gumbel"))
        requests.append(GenerationRequest(f"alone{salt}-{i}", tuple(tok.encode(PROMPTS[i % 4])), tokens,
                                          seed=1000 * salt + i,
                                          watermark=WatermarkPlan(key=key, key_id=f"k{i}", version=1,
                                                                  fingerprint=key.fingerprint)))

    async def one(request):
        async for event in engine.generate(request):
            if isinstance(event, Finished):
                return len(event.token_ids)

    start = time.perf_counter()
    total = sum(await asyncio.gather(*(one(r) for r in requests)))
    seconds = time.perf_counter() - start
    return {"tokens": total, "seconds": round(seconds, 4), "tokens_per_second": round(total / seconds, 1)}


def _ledger_counts(store_settings) -> dict:
    from sqlalchemy import func, select

    from keys.db import open_store
    from keys.models import LedgerEntry

    store = open_store(store_settings, require_kek=True)
    try:
        with store.transaction(write=False) as session:
            rows = dict(session.execute(select(LedgerEntry.kind, func.count()).group_by(LedgerEntry.kind)).all())
    finally:
        store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", nargs=2, metavar=("URL", "TOKEN"), help=argparse.SUPPRESS)
    parser.add_argument("--requests", default="64,256")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--database-url", default=None, help="default: a new SQLite file")
    parser.add_argument("--ledger-single", action="store_true",
                        help="the ledger's writes each alone in the group's transaction (as before ledger.grouped)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.client:
        client_main(*args.client)
        return

    from service.app import create_app
    from service.engines.local.engine import LocalEngine
    from service.settings import ServiceSettings
    from tests.service.gateway import TEST_DRAFT, TEST_MODEL, provision, serve

    if args.ledger_single:
        from service.access.group_commit import GroupCommit

        GroupCommit._batches = lambda self, session, group: {}  # noqa: SLF001 - the control arm
    sizes = [int(x) for x in args.requests.split(",")]
    most = max(sizes)
    tmp = Path(tempfile.mkdtemp(prefix="engine-http-"))
    store_settings, tokens = provision(tmp, args.database_url)
    engine = LocalEngine(TEST_MODEL, TEST_DRAFT, device=args.device, max_batch=most, max_queue=4 * most,
                         speculative_k=4)
    settings = ServiceSettings(model=TEST_MODEL, draft_model=TEST_DRAFT, device=args.device, max_batch=most,
                               max_queue=4 * most, tenant_max_concurrent_generations=0, tenant_tokens_per_minute=0,
                               log_level="warning")
    app = create_app(settings, engine=engine, store_settings=store_settings)
    started = time.perf_counter()
    url, server, thread = serve(app)
    startup = time.perf_counter() - started
    engine.eos_ids = frozenset()  # as bench/engine_cuda.py: every request runs its max_tokens
    services = app.state.services
    client = subprocess.Popen([sys.executable, __file__, "--client", url, tokens["acme"]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])

    def http_round(n: int, salt: int) -> dict:
        client.stdin.write(f"{n} {args.tokens} {salt}\n")
        client.stdin.flush()
        return json.loads(client.stdout.readline())

    result = {"device": _device_name(args.device), "startup_seconds": round(startup, 2),
              "ledger_grouped_appends": not args.ledger_single,
              "database": store_settings.database_url.split(":")[0], "tokens": args.tokens, "sizes": {},
              "command": "python bench/engine_http.py " + " ".join(sys.argv[1:])}
    try:
        for n in sizes:
            http_round(n, 1)  # warm-up: the gateway's first requests at this size
            asyncio.run(_engine_round(engine, n, args.tokens, 1))
            rounds = {"http": [], "engine": []}
            groups_before = (services.ledger_writes.groups, services.ledger_writes.writes,
                             services.ledger_writes.batched)
            for r in range(args.rounds):
                for mode in (("http", "engine") if r % 2 == 0 else ("engine", "http")):
                    if mode == "http":
                        rounds["http"].append(http_round(n, 10 + r))
                    else:
                        rounds["engine"].append(asyncio.run(_engine_round(engine, n, args.tokens, 10 + r)))
            groups = services.ledger_writes.groups - groups_before[0]
            writes = services.ledger_writes.writes - groups_before[1]
            batched = services.ledger_writes.batched - groups_before[2]
            http_seconds = sum(x["seconds"] for x in rounds["http"])
            http = [x["tokens_per_second"] for x in rounds["http"]]
            alone = [x["tokens_per_second"] for x in rounds["engine"]]
            firsts = [t for x in rounds["http"] for t in x.pop("first_token_s")]
            result["sizes"][n] = {
                "tokens_per_second_http": statistics.median(http),
                "tokens_per_second_engine_alone": statistics.median(alone),
                "http_vs_engine_per_round": round(statistics.median([a / b for a, b in zip(http, alone)]), 4),
                "first_token_s_p50": _percentile(firsts, 0.5), "first_token_s_p99": _percentile(firsts, 0.99),
                "receipts_signed": sum(x["receipts"] for x in rounds["http"]),
                "requests_ok": sum(x["ok"] for x in rounds["http"]),
                "ledger_groups": groups, "ledger_writes": writes,
                "ledger_writes_per_group": round(writes / max(groups, 1), 2), "ledger_writes_batched": batched,
                "ledger_entries_per_second_of_http_rounds": round(writes / max(http_seconds, 1e-9), 1),
                "rounds": rounds}
            print(json.dumps({"requests": n, **{k: v for k, v in result["sizes"][n].items() if k != "rounds"}}),
                  flush=True)
            if args.out:  # what is done so far
                Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        client.stdin.close()
        client.wait(60)
        server.should_exit = True
        thread.join(120)
    result["ledger_entries_by_kind"] = _ledger_counts(store_settings)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else device


if __name__ == "__main__":
    main()
