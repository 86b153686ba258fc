"""What the transparency log costs: per ledger entry, and in generation throughput under the
soak's load, log on and log off measured in one run.

1. Per entry (in process): ledger entries written as the gateway writes a finished
   watermarked generation (200 tokens, its k-grams, one transaction), in alternating blocks
   with the log on and off (``store.sequencing``), on SQLite and on PostgreSQL. The cost of
   the log is the difference of the blocks' medians; the time of the log's own append
   (:func:`ledger.log.tlog.append_entry`: head lock and MAC check, leaf, subtrees, head) is
   timed apart as well.
2. Under load: two gateway processes on one PostgreSQL database, one with the log (and
   checkpoints published every 256 entries / 30 s, the defaults) and one without
   (``HALLMARK_TRANSPARENCY_LOG=false``), each given half of the soak's 16 clients
   (bench/soak.py's request mix: JSON and streamed generation, detection, record look-ups)
   for the same minutes: both arms share the machine and its load, so their rates compare.
   Generations completed per second, per arm.

    PYTHONPATH=$PWD python -m bench.log_cost --duration 180 --out bench/results/log-cost.md
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

from bench.gateway import REPO, Gateway, percentile
from bench.soak import PG_ADMIN, Pool, Stats, client, provision

TOKENS = 200


def _store(url: str, tmp: Path):
    from keys import migrate
    from keys.db import open_store
    from keys.kek import generate_kek_file
    from keys.lifecycle import create_key
    from keys.settings import StoreSettings
    from keys.tenants import create_tenant
    from watermark.spec import WatermarkSpec

    kek = tmp / f"kek-{os.getpid()}-{time.monotonic_ns()}.key"
    generate_kek_file(kek)
    store = open_store(StoreSettings(database_url=url, kek_file=kek), require_kek=True, check_schema=False,
                       create=True)
    migrate.upgrade(store.engine)
    with store.transaction() as session:
        tenant = create_tenant(session, name="bench", actor="bench")
        key = create_key(session, store.keyring, tenant="bench", actor="bench", spec=WatermarkSpec())
    return store, tenant.id, key


def per_entry(url: str, tmp: Path, blocks: int, per_block: int) -> dict:
    """Median seconds per entry with the log on and off, and of the log's append alone."""
    import random

    from ledger import kgrams
    from ledger.log import tlog
    from ledger.entries import record_generation
    from keys.material import active_key

    store, tenant_id, key = _store(url, tmp)
    with store.transaction(write=False) as session:
        stored = active_key(session, store.keyring, tenant_id=tenant_id)
    rng = random.Random(7)
    appends: list[float] = []
    original = tlog.append_entry

    def timed_append(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            appends.append(time.perf_counter() - start)

    tlog.append_entry = timed_append
    arms: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for block in range(2 * blocks + 1):
            arm = "on" if block % 2 == 0 else "off"
            store.sequencing = arm == "on"
            start = time.perf_counter()
            for _ in range(per_block):
                tokens = [rng.randrange(50_000) for _ in range(TOKENS)]
                with store.transaction() as session:
                    record_generation(session, tenant_id=tenant_id, key_id=key.key_id, key_version=key.version,
                                      engine="bench", model="bench", spec=stored.spec, prompt_tokens=8,
                                      watermarked_tokens=TOKENS, unwatermarked_reason=None,
                                      output_text=" ".join(map(str, tokens)), token_ids=tokens,
                                      kgram_set=kgrams.kgram_set(key.key_id, stored.material.secret, tokens))
            if block:  # the first block warms the caches (and creates the log): not counted
                arms[arm].append((time.perf_counter() - start) / per_block)
        with store.transaction(write=False) as session:
            size, _ = tlog.read_head(session, None)
    finally:
        tlog.append_entry = original
        store.close()
    on, off = statistics.median(arms["on"]), statistics.median(arms["off"])
    return {"entry_on_ms": 1000 * on, "entry_off_ms": 1000 * off, "log_cost_ms": 1000 * (on - off),
            "append_ms_median": 1000 * statistics.median(appends[per_block:]),
            "append_ms_p99": 1000 * percentile(appends[per_block:], 0.99), "blocks": blocks,
            "entries_per_block": per_block, "log_size": size}


async def _load(pools: dict[str, Pool], tokens: dict[str, str], duration: float, clients: int) -> dict[str, Stats]:
    stats = {arm: Stats() for arm in pools}
    t0 = time.monotonic()
    arms = list(pools)
    await asyncio.gather(*(client(i, pools[arms[i % 2]], tokens, stats[arms[i % 2]], t0 + duration, t0)
                           for i in range(clients)))
    return stats


def under_load(tmp: Path, duration: float, clients: int) -> dict:
    from sqlalchemy import create_engine

    db_url, kek_file, tokens = provision(tmp)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HALLMARK_DATABASE_URL": db_url,
           "HALLMARK_KEK_FILE": str(kek_file), "HALLMARK_DEVICE": "cpu",
           "HALLMARK_DETECT_RATE_PER_MINUTE": "100000", "HALLMARK_DETECT_BURST": "10000"}
    for name in ("HALLMARK_KEK", "HALLMARK_KEK_PREVIOUS", "HALLMARK_KEK_PREVIOUS_FILE"):
        env.pop(name, None)
    on = Gateway({**env, "HALLMARK_TRANSPARENCY_LOG": "true"}, tmp / "gateway-on.log")
    gateways = [on]
    try:
        on.wait_ready()  # it creates the log and the signing key; the other arm only reads them
        off = Gateway({**env, "HALLMARK_TRANSPARENCY_LOG": "false"}, tmp / "gateway-off.log")
        gateways.append(off)
        off.wait_ready()
        pools = {"log on": Pool([on]), "log off": Pool([off])}
        start = time.monotonic()
        stats = asyncio.run(_load(pools, tokens, duration, clients))
        elapsed = time.monotonic() - start
    finally:
        for gateway in gateways:
            gateway.stop()
    engine = create_engine(db_url)
    with engine.connect() as connection:
        checkpoints = connection.exec_driver_sql("SELECT count(*) FROM log_checkpoints").scalar()
        leaves = connection.exec_driver_sql("SELECT count(*) FROM log_leaves").scalar()
    engine.dispose()
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {db_url.rsplit('/', 1)[1]} WITH (FORCE)")
    admin.dispose()
    out = {"elapsed_s": elapsed, "checkpoints_published": checkpoints, "log_leaves": leaves, "arms": {}}
    for arm, s in stats.items():
        generated = len(s.latency.get("generate", [])) + len(s.latency.get("generate (stream)", []))
        failed = sum(c for k, c in s.errors.items() if k.startswith("generate"))
        out["arms"][arm] = {
            "generations_per_s": (generated - failed) / elapsed, "generations": generated - failed,
            "errors": dict(s.errors), "unexpected": s.unexpected[:5],
            "routes": {route: {"requests": len(v), "p50_ms": 1000 * percentile(v, 0.5),
                               "p99_ms": 1000 * percentile(v, 0.99)} for route, v in sorted(s.latency.items())}}
    on_rate, off_rate = out["arms"]["log on"]["generations_per_s"], out["arms"]["log off"]["generations_per_s"]
    out["throughput_drop_percent"] = 100 * (off_rate - on_rate) / off_rate if off_rate else None
    return out


def render(args, result: dict) -> str:
    lines = ["# Transparency log: cost per entry and under load", "",
             f"`PYTHONPATH=$PWD python -m bench.log_cost --duration {args.duration:.0f} --clients {args.clients} "
             f"--blocks {args.blocks} --per-block {args.per_block}`, {result['when']} UTC, commit "
             f"{result['commit']}, load average before/after: {result['loadavg_before']} / {result['loadavg_after']} "
             "(the machine has 2 CPU cores, shared with other sessions' work).", "",
             "## Per ledger entry (in process)", "",
             "A finished watermarked generation of 200 tokens with its k-grams, one transaction each, in "
             "alternating blocks with the log on and off (the first block, which creates the log, not counted); "
             "medians of the blocks' per-entry times. *log append* is ledger.log.tlog.append_entry alone.", "",
             "| database | entry, log on (ms) | entry, log off (ms) | difference (ms) | log append median (ms) | log append p99 (ms) |",
             "|---|---:|---:|---:|---:|---:|"]
    for db, r in result["per_entry"].items():
        lines.append(f"| {db} | {r['entry_on_ms']:.3f} | {r['entry_off_ms']:.3f} | {r['log_cost_ms']:.3f} | "
                     f"{r['append_ms_median']:.3f} | {r['append_ms_p99']:.3f} |")
    load = result.get("under_load")
    if load:
        lines += ["", "## Under the soak's load (one run, both arms at once)", "",
                  f"Two gateways on one PostgreSQL database for {load['elapsed_s']:.0f} s, each given half of "
                  f"{args.clients} clients with bench/soak.py's mix; the log-on arm published "
                  f"{load['checkpoints_published']} checkpoint(s) (defaults: every 256 entries or 30 s) and holds "
                  f"{load['log_leaves']} leaves.", "",
                  "| arm | generations | generations/s | generate p50 (ms) | generate p99 (ms) | errors |",
                  "|---|---:|---:|---:|---:|---|"]
        for arm, r in load["arms"].items():
            g = r["routes"].get("generate", {"p50_ms": float("nan"), "p99_ms": float("nan")})
            lines.append(f"| {arm} | {r['generations']} | {r['generations_per_s']:.3f} | {g['p50_ms']:.0f} | "
                         f"{g['p99_ms']:.0f} | {r['errors'] or 'none'} |")
        drop = load["throughput_drop_percent"]
        if drop is not None:
            where = f"{drop:.1f} % below" if drop >= 0 else f"{-drop:.1f} % above"
            lines += ["", f"Generation throughput with the log was {where} the arm without it in this run (goal: "
                          "at most 5 % below)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=180)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--per-block", type=int, default=200)
    parser.add_argument("--no-load", action="store_true", help="only the per-entry measurement")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import subprocess

    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                       text=True).stdout.strip(),
              "loadavg_before": open("/proc/loadavg").read().split()[0], "per_entry": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        result["per_entry"]["SQLite"] = per_entry(f"sqlite:///{tmp / 'entries.db'}", tmp, args.blocks, args.per_block)
        from sqlalchemy import create_engine

        name = f"hallmark_logcost_{os.getpid()}"
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            connection.exec_driver_sql(f"CREATE DATABASE {name}")
        try:
            result["per_entry"]["PostgreSQL"] = per_entry(PG_ADMIN.rsplit("/", 1)[0] + "/" + name, tmp, args.blocks,
                                                          args.per_block)
        finally:
            with admin.connect() as connection:
                connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.dispose()
        if not args.no_load:
            result["under_load"] = under_load(tmp, args.duration, args.clients)
    result["loadavg_after"] = open("/proc/loadavg").read().split()[0]
    report = render(args, result)
    print(report)
    if args.out:
        args.out.write_text(report)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
