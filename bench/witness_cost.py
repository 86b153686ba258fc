"""What witnessing costs (issue 32, item 7): publication latency with two local witnesses,
ledger-write throughput with witnessed publication against unwitnessed, and tile serving.

Two `hallmark witness serve` processes on loopback (one Ed25519, one ML-DSA-44), a SQLite
store with the transparency log, all on this machine.

1. Publication latency: entries are written (a finished watermarked generation's record,
   200 tokens and its k-grams, as bench/log_cost.py writes them), then one publication
   round is timed as the gateway runs it (service.state.Services.publish_checkpoint with a
   policy): sign the checkpoint, send it to both witnesses in parallel with the consistency
   proof from their last size (service.witnessing), verify both cosignatures, store the
   cosigned checkpoint. ``--rounds`` rounds of ``--entries-per-round`` entries; p50 / p99.
2. Throughput: entries written back to back in alternating blocks, one arm publishing
   every 256 entries unwitnessed on the writing thread (today's behaviour without a
   policy), the other handing each publication to a background thread that runs the
   witnessed round (the gateway's publisher thread). Entries per second, median of the
   blocks per arm; the difference is the witnessing's share of a writer's CPU (a real
   generation spends far longer in the model per entry, so its share there is smaller).
3. Tile serving: ``GET /v1/ledger/log/tile/...`` from a server process with the log's
   routes (full level-0 tiles, cached as immutable; partial tiles and entry bundles read
   from the store), 8 concurrent clients, requests per second.

    PYTHONPATH=$PWD python -m bench.witness_cost --out bench/results/witness-cost.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.gateway import REPO, free_port, percentile
from bench.log_cost import TOKENS, _store


def _witness(tmp: Path, name: str, algorithm: str, log_vkey: str) -> tuple[subprocess.Popen, str, str]:
    from service.cli.witness_cmds import load_or_create

    directory = tmp / name
    vkey = load_or_create(directory, f"{name}.bench", algorithm).key.vkey
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "witness", "serve", "--dir", str(directory),
                                "--log", log_vkey, "--port", str(port)], cwd=REPO, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(f"{url}/{'0' * 64}/checkpoint", timeout=2)
            return process, url, vkey
        except httpx.HTTPError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"witness {name} did not start")
            time.sleep(0.2)


class Writer:
    def __init__(self, store, tenant_id, key) -> None:
        from keys.material import active_key

        self.store, self.tenant_id, self.key = store, tenant_id, key
        with store.transaction(write=False) as session:
            self.stored = active_key(session, store.keyring, tenant_id=tenant_id)
        self.rng = random.Random(7)

    def entry(self) -> int:
        from ledger import kgrams
        from ledger.entries import record_generation

        tokens = [self.rng.randrange(50_000) for _ in range(TOKENS)]
        with self.store.transaction() as session:
            found = record_generation(session, tenant_id=self.tenant_id, key_id=self.key.key_id,
                                      key_version=self.key.version, engine="bench", model="bench",
                                      spec=self.stored.spec, prompt_tokens=8, watermarked_tokens=TOKENS,
                                      unwatermarked_reason=None, output_text=" ".join(map(str, tokens)),
                                      token_ids=tokens,
                                      kgram_set=kgrams.kgram_set(self.key.key_id, self.stored.material.secret, tokens))
        return found.log.size


def publish(store, witnessing) -> int | None:
    """One publication round, as service.state.Services.publish_checkpoint runs it."""
    from ledger.log import tlog

    signed = None
    if witnessing is not None:
        with store.transaction(write=False) as session:
            size, root, note = tlog.current_checkpoint(session, tlog.required_authority(session))

        def consistency(old: int, new: int) -> list[bytes]:
            with store.transaction(write=False) as session:
                return tlog.consistency_proof(session, old, new)

        cosigned = witnessing.cosign(note, size, consistency)
        if cosigned is None:
            return None
        signed = (size, root, cosigned[0])
    with store.transaction() as session:
        tlog.publish(session, tlog.required_authority(session), signed=signed)
        return tlog.published_size(session)


def latency(store, writer: Writer, witnessing, rounds: int, per_round: int) -> dict:
    """Wall time of each round, and the CPU this process spent on it and on each entry
    (process_time: the witnesses are other processes; nothing else runs here meanwhile), so
    the witnessing's share of a writer's CPU is measured apart from this box's load."""
    times, cpu_rounds, cpu_entries = [], [], []
    for i in range(rounds + 2):
        cpu = time.process_time()
        for _ in range(per_round):
            writer.entry()
        cpu_entries.append((time.process_time() - cpu) / per_round)
        start, cpu = time.perf_counter(), time.process_time()
        if publish(store, witnessing) is None:
            raise SystemExit("a witnessed round was not published: the witnesses refused")
        if i >= 2:  # the first rounds open connections
            times.append(time.perf_counter() - start)
            cpu_rounds.append(time.process_time() - cpu)
    round_cpu, entry_cpu = statistics.median(cpu_rounds), statistics.median(cpu_entries)
    return {"rounds": rounds, "entries_per_round": per_round, "p50_ms": 1000 * percentile(times, 0.5),
            "p99_ms": 1000 * percentile(times, 0.99), "max_ms": 1000 * max(times),
            "round_cpu_ms_median": 1000 * round_cpu, "entry_cpu_ms_median": 1000 * entry_cpu,
            "round_cpu_share_at_256_entries_pct": 100 * round_cpu / (256 * entry_cpu)}


def throughput(store, writer: Writer, witnessing, blocks: int, per_block: int, every: int = 256) -> dict:
    wanted = threading.Event()
    stop = threading.Event()
    published = {"witnessed": 0}

    def publisher() -> None:
        while not stop.is_set():
            if wanted.wait(0.1):
                wanted.clear()
                if publish(store, witnessing) is not None:
                    published["witnessed"] += 1

    thread = threading.Thread(target=publisher, daemon=True)
    thread.start()
    rates: dict[str, list[float]] = {"unwitnessed": [], "witnessed": []}
    last = writer.entry()
    try:
        for block in range(2 * blocks + 1):
            arm = "unwitnessed" if block % 2 else "witnessed"
            start = time.perf_counter()
            for _ in range(per_block):
                size = writer.entry()
                if size - last >= every:
                    last = size
                    if arm == "witnessed":
                        wanted.set()
                    else:
                        publish(store, None)
            if block:
                rates[arm].append(per_block / (time.perf_counter() - start))
    finally:
        stop.set()
        thread.join(30)
    on, off = statistics.median(rates["witnessed"]), statistics.median(rates["unwitnessed"])
    return {"blocks_per_arm": blocks, "entries_per_block": per_block, "publish_every": every,
            "witnessed_entries_per_s": on, "unwitnessed_entries_per_s": off, "difference_pct": 100 * (on - off) / off,
            "witnessed_rounds": published["witnessed"],
            "rates": {k: [round(v, 1) for v in vs] for k, vs in rates.items()}}


def _tile_server(url: str, kek: Path, port: int) -> subprocess.Popen:
    code = ("import sys, uvicorn\n"
            "from types import SimpleNamespace\n"
            "from fastapi import FastAPI\n"
            "from keys.db import open_store\nfrom keys.settings import StoreSettings\n"
            "from service.routes import ledger_log\n"
            f"store = open_store(StoreSettings(database_url={url!r}, kek_file={str(kek)!r}), require_kek=True)\n"
            "app = FastAPI()\napp.include_router(ledger_log.router)\n"
            "app.state.services = SimpleNamespace(store=store)\n"
            f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning', access_log=False)\n")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stderr=subprocess.DEVNULL)


async def _hammer(base: str, paths: list[str], seconds: float, clients: int) -> tuple[int, list[float]]:
    done, times = 0, []
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            k = i
            while time.monotonic() < deadline:
                start = time.perf_counter()
                response = await http.get(paths[k % len(paths)])
                times.append(time.perf_counter() - start)
                assert response.status_code == 200, response.text
                done += 1
                k += clients

    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(clients)))
    return int(done / (time.monotonic() - start)), times


def tiles(url: str, kek: Path, size: int, seconds: float) -> dict:
    from ledger.log import tiles as tile_paths

    port = free_port()
    server = _tile_server(url, kek, port)
    base = f"http://127.0.0.1:{port}/v1/ledger/log"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(base + "/checkpoint", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit("the tile server did not start")
                time.sleep(0.2)
        full = [tile_paths.Tile(0, n, 256).path for n in range(size // 256)]
        partial = [t.path for t in tile_paths.tiles_for(size)]
        out = {}
        for name, paths in (("full_tiles", full), ("partial_tiles_and_bundles", partial)):
            rate, times = asyncio.run(_hammer(base, ["/" + p for p in paths], seconds, 8))
            out[name] = {"requests_per_s": rate, "p50_ms": 1000 * percentile(times, 0.5),
                         "p99_ms": 1000 * percentile(times, 0.99), "paths": len(paths)}
        return out
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--entries-per-round", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--entries-per-block", type=int, default=600)
    parser.add_argument("--tile-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from ledger.log import tlog
    from ledger.log.policy import parse
    from service.witnessing import Witnessing

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        url = f"sqlite:///{tmp / 'bench.db'}"
        store, tenant_id, key = _store(url, tmp)
        writer = Writer(store, tenant_id, key)
        writer.entry()  # creates the log
        with store.transaction(write=False) as session:
            log_vkey = tlog.required_authority(session).verifier.vkey
        kek = next(tmp.glob("kek-*.key"))
        processes = []
        try:
            lines = []
            for name, algorithm in (("ed", "ed25519"), ("pq", "ml-dsa-44")):
                process, wurl, vkey = _witness(tmp, name, algorithm, log_vkey)
                processes.append(process)
                lines.append(f"witness {name} {vkey} {wurl}\n")
            witnessing = Witnessing(parse("".join(lines) + "group both all ed pq\nquorum both\n"), timeout=2.0)
            result = {"latency_witnessed": latency(store, writer, witnessing, args.rounds, args.entries_per_round),
                      "latency_unwitnessed": latency(store, writer, None, args.rounds, args.entries_per_round),
                      "throughput": throughput(store, writer, witnessing, args.blocks, args.entries_per_block)}
            with store.transaction(write=False) as session:
                size = tlog.published_size(session)
            result["tiles"] = tiles(url, kek, size, args.tile_seconds)
            result["log_size"] = size
        finally:
            for process in processes:
                process.terminate()
                process.wait(30)
            store.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        command = "PYTHONPATH=$PWD python -m bench.witness_cost " + " ".join(sys.argv[1:])
        args.out.write_text(f"# Witnessing cost (issue 32, item 7)\n\nCommand: `{command}`\n\n"
                            f"Machine: the shared 2-core dev box, no GPU, loaded by other work while it ran "
                            f"(figures are indicative). SQLite store; two `hallmark witness serve` processes on "
                            f"loopback (Ed25519, ML-DSA-44), quorum both.\n\n```json\n{text}\n```\n")


if __name__ == "__main__":
    main()
