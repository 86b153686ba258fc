"""Soak: 16 clients for 10 minutes against two gateway processes on PostgreSQL, with faults.

Three tenants; the clients mix generation (JSON and streaming), detection and record
look-ups, each request to one of the gateways in service. Meanwhile a key rotation every
30 s (round robin over the tenants, through the admin API), one revocation (a verify-only
key), one staged KEK rotation and one restart of the PostgreSQL server.

The staged KEK rotation is the documented procedure (docs/concepts/keys.md, KEKs): ``hallmark kek generate`` a new KEK; a
rolling restart gives each gateway ``HALLMARK_KEK_FILE=<new>`` and
``HALLMARK_KEK_PREVIOUS_FILE=<old>`` (a gateway leaves the clients' rotation, drains,
restarts and rejoins, so the other one serves meanwhile); ``hallmark kek rotate`` re-wraps
every key; ``hallmark kek status`` must show no key under the old KEK id; a second rolling
restart drops the previous KEK.

Checks: no unexpected 5xx (a 503 while the database restarts, or saying it is unavailable,
is expected); every generation a client received is in the ledger; exactly one active key
per tenant at every observation; every output (with at least 24 watermarked tokens) is
detected under the key its record names. Results: per-route rates and p50/p99, errors by
kind, the checks; ``--out`` writes them as Markdown.

    flock /tmp/hallmark-bench.lock python -m bench.soak --duration 600 --out bench/results/soak.md \
        [--announce FILE]   # appends a line before and after the PostgreSQL restart

Restarting the server (``pg_ctlcluster ... restart``) stops every other user of it for a
few seconds: run this on a machine of your own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from bench.gateway import REPO, Gateway, percentile
PG_ADMIN = os.environ.get("HALLMARK_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
TENANTS = ("acme", "globex", "initech")
PROMPTS = ("The function returns", "Return a new list", "This module provides", "The value of",
           "If the argument is", "Raise an error when")


def _pg_version() -> str:
    return sorted(os.listdir("/etc/postgresql"))[0]


def provision(tmp: Path) -> tuple[str, Path, dict[str, str]]:
    sys.path.insert(0, str(REPO))
    from keys import migrate
    from keys.db import open_store
    from keys.kek import generate_kek_file
    from keys.lifecycle import create_key
    from keys.settings import StoreSettings
    from keys.tenants import create_tenant
    from keys.tokens import issue_token
    from watermark.spec import WatermarkSpec

    name = f"hallmark_soak_{os.getpid()}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    kek_file = tmp / "kek.key"
    generate_kek_file(kek_file)
    store = open_store(StoreSettings(database_url=url, kek_file=kek_file), require_kek=True, check_schema=False)
    tokens = {}
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            for tenant, algorithm in zip(TENANTS, ("dual_key_gumbel", "gumbel", "gumbel")):
                create_tenant(session, name=tenant, actor="soak")
                create_key(session, store.keyring, tenant=tenant, actor="soak", spec=WatermarkSpec(algorithm=algorithm))
                tokens[tenant] = issue_token(session, tenant=tenant, actor="soak").raw_token
            tokens["admin"] = issue_token(session, tenant=None, admin=True, actor="soak").raw_token
    finally:
        store.close()
    return url, kek_file, tokens


class Stats:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: Counter = Counter()
        self.unexpected: list[str] = []
        self.generations: list[dict] = []  # {"id", "tenant", "token_ids", "watermarked"}
        self.events: list[str] = []
        self.outage: tuple[float, float] | None = None
        self.restarts: list[list[float]] = []  # [start, end] of each gateway restart (s since t0)
        self.key_observations: Counter = Counter()
        self.bad_observations: list[str] = []
        self.kek_ok: bool | None = None
        self.last_unavailable = 0.0  # when the last 503 of a database outage was answered (s since t0)

    def add(self, route: str, seconds: float, status: int, body: str, at: float) -> None:
        self.latency[route].append(seconds)
        if status >= 400:
            try:
                code = json.loads(body)["error"]["code"]
            except Exception:  # noqa: BLE001
                code = "?"
            self.errors[f"{route} {status} {code}"] += 1
            during_outage = self.outage is not None and self.outage[0] - 1 <= at <= self.outage[1] + 10
            if status == 503 and during_outage:
                self.last_unavailable = max(self.last_unavailable, at)
            if status >= 500 and not (status == 503 and (during_outage or "unavailable" in code)):
                if status == 599 and any(a - 1 <= at <= b + 1 for a, b in self.restarts):
                    self.errors["transport error during a gateway's restart"] += 1
                    return
                self.unexpected.append(f"{route} {status} at {at:.0f} s, {seconds * 1000:.0f} ms: {body[:200]}")


class Pool:
    """The gateways in service; the operator takes one out while it restarts."""

    def __init__(self, gateways: list[Gateway]) -> None:
        self.gateways = list(gateways)
        self.live = [g.url for g in gateways]

    def pick(self, rng: random.Random) -> str:
        return rng.choice(self.live)


async def client(worker: int, pool: Pool, tokens: dict[str, str], stats: Stats, stop_at: float, t0: float) -> None:
    rng = random.Random(worker)
    async with httpx.AsyncClient(timeout=120) as http:
        while time.monotonic() < stop_at:
            url = pool.pick(rng)
            tenant = TENANTS[worker % 3]
            headers = {"Authorization": f"Bearer {tokens[tenant]}"}
            pick = rng.random()
            start = time.monotonic()
            try:
                if pick < 0.3 or (pick < 0.85 and not stats.generations):
                    body = {"prompt": rng.choice(PROMPTS), "max_tokens": 48, "seed": rng.randrange(2**31)}
                    r = await http.post(url + "/v1/generate", json=body, headers=headers)
                    route = "generate"
                    if r.status_code == 200:
                        out = r.json()
                        stats.generations.append({"id": out["generation_id"], "tenant": tenant,
                                                  "token_ids": out["token_ids"],
                                                  "watermarked": (out["watermark"] or {}).get("watermarked_tokens", 0)})
                    status, text_ = r.status_code, r.text
                elif pick < 0.5:
                    body = {"prompt": rng.choice(PROMPTS), "max_tokens": 48, "seed": rng.randrange(2**31), "stream": True}
                    route = "generate (stream)"
                    async with http.stream("POST", url + "/v1/generate", json=body, headers=headers) as r:
                        status, text_ = r.status_code, ""
                        if status != 200:
                            text_ = (await r.aread()).decode()
                        else:
                            final = error = None
                            async for line in r.aiter_lines():
                                if line.startswith("data: {"):
                                    event = json.loads(line[6:])
                                    if event.get("type") == "done":
                                        final = event
                                    elif event.get("type") == "error":
                                        error = event
                            if final is not None:
                                stats.generations.append({"id": final["generation_id"], "tenant": tenant,
                                                          "token_ids": final["token_ids"],
                                                          "watermarked": (final["watermark"] or {}).get(
                                                              "watermarked_tokens", 0)})
                            elif error is not None:  # an error event in the stream counts as its status
                                code = error["error"].get("code", "")
                                status, text_ = (503 if "unavailable" in code else 500), json.dumps(error)
                            else:
                                status, text_ = 500, '{"error": {"code": "stream_without_summary"}}'
                elif pick < 0.85:
                    mine = [g for g in stats.generations[-200:] if g["tenant"] == tenant] or stats.generations[-50:]
                    r = await http.post(url + "/v1/detect", json={"token_ids": rng.choice(mine)["token_ids"] or [1]},
                                        headers=headers)
                    route, status, text_ = "detect", r.status_code, r.text
                else:
                    mine = [g for g in stats.generations[-200:] if g["tenant"] == tenant] or [{"id": "0" * 32}]
                    r = await http.get(url + f"/v1/generations/{rng.choice(mine)['id']}", headers=headers)
                    route, status, text_ = "record", r.status_code, r.text
            except httpx.HTTPError as exc:
                route, status, text_ = "transport", 599, json.dumps({"error": {"code": type(exc).__name__}})
            stats.add(route, time.monotonic() - start, status, text_, time.monotonic() - t0)


async def operator(pool: Pool, db_url: str, tokens: dict[str, str], stats: Stats, duration: float, t0: float,
                   restart: bool, kek: bool, env: dict[str, str], tmp: Path, announce: Path | None) -> None:
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    engine = create_engine(db_url, pool_pre_ping=True)
    done_revoke = done_restart = False
    kek_task: asyncio.Task | None = None
    rotation = 0
    next_rotation = 30.0
    async with httpx.AsyncClient(timeout=60, headers=admin) as http:
        while (now := time.monotonic() - t0) < duration:
            url = pool.live[0]
            # Observation: exactly one active key per tenant.
            try:
                with engine.connect() as connection:
                    rows = dict(connection.execute(text(
                        "SELECT t.name, count(k.id) FROM tenants t LEFT JOIN watermark_keys k "
                        "ON k.tenant_id = t.id AND k.state = 'active' GROUP BY t.name")).all())
                stats.key_observations["ok" if all(rows.get(t) == 1 for t in TENANTS) else "bad"] += 1
                if any(rows.get(t) != 1 for t in TENANTS):
                    stats.bad_observations.append(f"{now:.0f}s {rows}")
            except Exception:  # noqa: BLE001 - the database restarting
                stats.key_observations["unobservable (database down)"] += 1
            if now >= next_rotation:
                tenant = TENANTS[rotation % 3]
                rotation += 1
                next_rotation += 30
                r = await _admin_call(http, "POST", url + "/v1/admin/keys/rotate", json={"tenant": tenant})
                stats.events.append(f"{now:.0f}s rotate {tenant}: {r}")
            if not done_revoke and now >= duration * 0.35:
                done_revoke = True
                keys = (await http.get(url + "/v1/admin/keys", params={"tenant": "globex"})).json().get("keys", [])
                old = [k for k in keys if k["state"] == "verify-only"]
                if old:
                    r = await _admin_call(http, "POST", url + f"/v1/admin/keys/{old[0]['key_id']}/revoke",
                                          json={"reason": "soak test"})
                    stats.events.append(f"{now:.0f}s revoke {old[0]['key_id']} (globex, verify-only): {r}")
            if kek and kek_task is None and now >= duration * 0.3:
                kek_task = asyncio.create_task(staged_kek_rotation(pool, env, tmp, stats, t0))
            if (restart and not done_restart and now >= duration * 0.6
                    and (kek_task is None or kek_task.done() or now >= duration * 0.8)):
                done_restart = True
                _announce(announce, "restarting the PostgreSQL server now (bench/soak.py)")
                start = time.monotonic()
                stats.outage = (start - t0, start - t0)
                done = await asyncio.to_thread(subprocess.run, ["pg_ctlcluster", "--skip-systemctl-redirect",
                                                                _pg_version(), "main", "restart"],
                                               capture_output=True, text=True, preexec_fn=_normal_priority)
                stats.outage = (start - t0, time.monotonic() - t0)
                _announce(announce, f"PostgreSQL restart done (rc {done.returncode}, "
                                    f"{time.monotonic() - start:.1f} s)")
                stats.events.append(f"{now:.0f}s PostgreSQL restart: rc {done.returncode}, "
                                    f"{time.monotonic() - start:.1f} s down")
            await asyncio.sleep(1.0)
    if kek_task is not None:
        await kek_task
    engine.dispose()


async def _admin_call(http: httpx.AsyncClient, method: str, url: str, **kwargs) -> str:
    try:
        r = await http.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        return f"transport error {type(exc).__name__}"
    if r.status_code < 400:
        return str(r.status_code)
    try:
        return f"{r.status_code} {r.json()['error']['code']}"
    except Exception:  # noqa: BLE001
        return f"{r.status_code} {r.text[:100]}"


def _normal_priority() -> None:
    """The restarted server must not inherit this run's ``nice`` (every user of it would)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except PermissionError:  # not root: it runs niced, as this process does
        pass


def _announce(path: Path | None, line: str) -> None:
    if path is not None:
        with open(path, "a") as out:
            out.write(f"- {time.strftime('%H:%M:%S', time.gmtime())} UTC integ: {line}\n")


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=env, capture_output=True, text=True,
                          cwd=REPO)


async def _rolling_restart(pool: Pool, env: dict[str, str], tmp: Path, stats: Stats, t0: float) -> list[str]:
    """Restart each gateway with ``env``, one at a time, the other serving meanwhile."""
    notes = []
    for i, old in enumerate(list(pool.gateways)):
        start = time.monotonic()
        pool.live.remove(old.url)
        stats.restarts.append([start - t0, float("inf")])
        await asyncio.sleep(2.0)  # requests already sent to it finish; SIGTERM drains the rest
        await asyncio.to_thread(old.stop)
        new = Gateway(env, tmp / f"gateway-{i}.log")
        await asyncio.to_thread(new.wait_ready)
        pool.gateways[i] = new
        pool.live.append(new.url)
        stats.restarts[-1][1] = time.monotonic() - t0
        notes.append(f"gateway {i} out of service {time.monotonic() - start:.0f} s")
    return notes


async def staged_kek_rotation(pool: Pool, env: dict[str, str], tmp: Path, stats: Stats, t0: float) -> None:
    """The documented staged rollout of a new KEK under load (see the module docstring)."""
    begin = time.monotonic() - t0
    old_file, new_file = Path(env["HALLMARK_KEK_FILE"]), tmp / "kek-new.key"
    steps = []
    made = await asyncio.to_thread(_cli, env, "kek", "generate", "--out", str(new_file), "--json")
    if made.returncode != 0:
        stats.events.append(f"{begin:.0f}s staged KEK rotation FAILED at kek generate: {made.stderr[-300:]}")
        stats.kek_ok = False
        return
    staged = {**env, "HALLMARK_KEK_FILE": str(new_file), "HALLMARK_KEK_PREVIOUS_FILE": str(old_file)}
    steps += await _rolling_restart(pool, staged, tmp, stats, t0)
    rotated = await asyncio.to_thread(_cli, env, "kek", "rotate", "--new-kek-file", str(new_file), "--json")
    status = await asyncio.to_thread(_cli, staged, "kek", "status", "--json")
    try:
        counts = json.loads(rotated.stdout)
        keks = json.loads(status.stdout)
        old_id = counts["previous_kek_ids"]
        left = {k: v for k, v in {**keks.get("watermark_keys", {}), **keks.get("signing_keys", {})}.items()
                if k in old_id and v}
        steps.append(f"kek rotate re-wrapped {counts['rewrapped_keys']} key(s) {'/'.join(old_id)} -> "
                     f"{counts['new_kek_id']}; kek status: watermark keys {keks.get('watermark_keys')}, "
                     f"signing keys {keks.get('signing_keys')}")
        stats.kek_ok = rotated.returncode == 0 and status.returncode == 0 and not left
    except (ValueError, KeyError) as exc:
        steps.append(f"FAILED: rotate rc {rotated.returncode} {rotated.stderr[-300:]!r}; "
                     f"status rc {status.returncode} {status.stderr[-300:]!r} ({type(exc).__name__})")
        stats.kek_ok = False
    final = {**env, "HALLMARK_KEK_FILE": str(new_file)}
    final.pop("HALLMARK_KEK_PREVIOUS_FILE", None)
    steps += await _rolling_restart(pool, final, tmp, stats, t0)
    stats.events.append(f"{begin:.0f}s-{time.monotonic() - t0:.0f}s staged KEK rotation: " + "; ".join(steps))


def check_ledger(db_url: str, stats: Stats) -> tuple[int, int]:
    engine = create_engine(db_url)
    ids = [g["id"] for g in stats.generations]
    with engine.connect() as connection:
        found = {row[0] for row in connection.execute(text("SELECT DISTINCT generation_id FROM ledger_entries"))}
    engine.dispose()
    return sum(1 for i in ids if i in found), len(ids)


async def check_detection(url: str, db_url: str, tokens: dict[str, str], stats: Stats) -> dict:
    """Detect each output (with >= 24 watermarked tokens) within its tenant's keys. An output
    passes when it is detected (p below the threshold) under the key its record names; one
    detected under no key is weak evidence (short, low-entropy text from the tiny model),
    counted apart with its own key's p; one detected under another key fails."""
    engine = create_engine(db_url)
    with engine.connect() as connection:
        keys = {row[0]: row[1] for row in connection.execute(text("SELECT generation_id, key_id FROM ledger_entries"))}
    engine.dispose()
    out = {"checked": 0, "detected": 0, "weak": [], "bad": []}
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 headers={"Authorization": f"Bearer {tokens['admin']}"}) as http:
        for g in stats.generations:
            if g["watermarked"] < 24 or g["id"] not in keys:
                continue
            out["checked"] += 1
            r = await http.post("/v1/detect", json={"token_ids": g["token_ids"], "tenant": g["tenant"], "spans": False})
            result = r.json()
            if r.status_code == 200 and result.get("watermarked") and (result.get("key") or {}).get("key_id") == keys[g["id"]]:
                out["detected"] += 1
                continue
            own = [k for k in result.get("per_key") or [] if k.get("key_id") == keys[g["id"]]]
            if r.status_code == 200 and not result.get("watermarked") and own:
                out["weak"].append(own[0]["log10_p_value"])
            else:
                out["bad"].append(f"{g['id']}: {r.status_code} {str(result)[:300]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--no-restart", action="store_true", help="do not restart the PostgreSQL server")
    parser.add_argument("--no-kek-rotation", action="store_true", help="skip the staged KEK rotation")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--announce", type=Path, help="append a line here before and after the PostgreSQL restart")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db_url, kek_file, tokens = provision(Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(REPO), "HALLMARK_DATABASE_URL": db_url,
               "HALLMARK_KEK_FILE": str(kek_file), "HALLMARK_DEVICE": "cpu",
               # Detection limit raised: 16 clients on three tokens would otherwise mostly see 429s.
               "HALLMARK_DETECT_RATE_PER_MINUTE": "100000", "HALLMARK_DETECT_BURST": "10000"}
        env.pop("HALLMARK_KEK", None)
        env.pop("HALLMARK_KEK_PREVIOUS", None)
        env.pop("HALLMARK_KEK_PREVIOUS_FILE", None)
        pool = Pool([Gateway(env, Path(tmp) / f"gateway-{i}.log") for i in range(2)])
        try:
            for gateway in pool.gateways:
                gateway.wait_ready()
            stats = Stats()
            t0 = time.monotonic()

            async def soak() -> None:
                await asyncio.gather(operator(pool, db_url, tokens, stats, args.duration, t0, not args.no_restart,
                                              not args.no_kek_rotation, env, Path(tmp), args.announce),
                                     *(client(i, pool, tokens, stats, t0 + args.duration, t0)
                                       for i in range(args.clients)))

            asyncio.run(soak())
            elapsed = time.monotonic() - t0
            recorded, received = check_ledger(db_url, stats)
            detection = asyncio.run(check_detection(pool.live[0], db_url, tokens, stats))
        finally:
            for gateway in pool.gateways:
                gateway.stop()
        report = render(args, stats, elapsed, recorded, received, detection)
        print(report)
        if args.out:
            args.out.write_text(report)
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {db_url.rsplit('/', 1)[1]} WITH (FORCE)")
        admin.dispose()


def render(args, stats: Stats, elapsed: float, recorded: int, received: int, detection: dict) -> str:
    weak = sorted(detection["weak"])
    lines = ["# Soak benchmark", "",
             f"`python -m bench.soak --duration {args.duration:.0f} --clients {args.clients}"
             f"{' --no-restart' if args.no_restart else ''}{' --no-kek-rotation' if args.no_kek_rotation else ''}` — two gateway processes (local engine, bundled models, "
             "CPU; clients spread over the ones in service), PostgreSQL, three tenants. Detection limit raised to 100,000/min (otherwise default limits, "
             "including per-tenant generation limits). The machine has 2 CPU cores, shared during the run with "
             "four other sessions' tests and builds, and the clients run on it too: rates are lower bounds and "
             "latencies include CPU contention.", "",
             "| route | requests | rate (/s) | p50 (ms) | p99 (ms) |", "|---|---:|---:|---:|---:|"]
    for route, values in sorted(stats.latency.items()):
        lines.append(f"| {route} | {len(values)} | {len(values) / elapsed:.2f} | {1000 * percentile(values, 0.5):.0f} "
                     f"| {1000 * percentile(values, 0.99):.0f} |")
    lines += ["", "Errors by kind (route, status, code):", ""]
    lines += [f"- {kind}: {count}" for kind, count in sorted(stats.errors.items())] or ["- none"]
    lines += ["", "Events:", ""] + [f"- {e}" for e in stats.events]
    if stats.outage is not None:
        lines.append(f"- the last 503 of the database outage was answered "
                     f"{max(0.0, stats.last_unavailable - stats.outage[1]):.1f} s after the restart command returned")
    ok = lambda c: "PASS" if c else "FAIL"  # noqa: E731
    lines += ["", "Checks:", "",
              f"- {ok(not stats.unexpected)} unexpected 5xx: {len(stats.unexpected)}"
              + "".join(f"\n  - {u}" for u in stats.unexpected[:10]),
              f"- {ok(recorded == received)} every generation received is in the ledger: {recorded} / {received}",
              f"- {ok(stats.key_observations['bad'] == 0)} exactly one active key per tenant at every observation: "
              f"{dict(stats.key_observations)}" + "".join(f"\n  - {b}" for b in stats.bad_observations[:5]),
              f"- {ok(not detection['bad'])} no output detected under a key other than the one its record names "
              f"(or not tested under it): {len(detection['bad'])} of {detection['checked']}"
              + "".join(f"\n  - {b}" for b in detection["bad"][:10]),
              f"- outputs (>= 24 watermarked tokens) detected under the key their record names at the threshold "
              f"(1e-6): {detection['detected']} / {detection['checked']}; the other {len(weak)} were detected under "
              f"no key (weak evidence; log10 p under their record's key from {weak[0]:.1f} to "
              f"{weak[-1]:.1f})" if weak else
              f"- {ok(detection['detected'] == detection['checked'])} outputs (>= 24 watermarked tokens) detected "
              f"under the key their record names: {detection['detected']} / {detection['checked']}",
              f"- {'SKIPPED' if stats.kek_ok is None else ok(stats.kek_ok)} staged KEK rotation: every key under the "
              "new KEK, none left under the old one (see events)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
