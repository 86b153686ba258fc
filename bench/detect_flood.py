"""One tenant floods /v1/detect with huge bodies; another tenant's small check must stay fast.

    .venv/bin/python -m bench.detect_flood [--parallel 24] [--chars 190000] [--seconds 30] [--ids 8000]
        [--rounds 3] [--baseline-repo /tmp/base]

Starts `hallmark serve` (bundled model, fresh SQLite store, default limits: per-principal
detection slots, character limit before tokenising). Tenant "flood" keeps ``--parallel``
requests of ``--chars`` characters in flight (each answered request is sent again) for
``--seconds``; meanwhile tenant "victim" sends an 11-character check every 0.25 s. Reports the
victim's latency percentiles, the flood's status codes, and the gateway's resident memory
(VmRSS of its process, sampled every 0.2 s) before and at its peak.

``--rounds N`` (issue 31 item 5: another principal's p99 at most twice its idle p99): N rounds
of an idle phase (the victim alone) then a flooded one, ``--seconds`` each, on one gateway;
the victim's checks run in a process of their own (started before each phase, the flood
waits for it), and each phase reports the victim's percentiles and every latency, the flood's
answers, and the gateway's and its workers' CPU seconds. ``--baseline-repo PATH``: a second
gateway from another tree (e.g. ``git archive`` of an older commit), its own store, the
rounds alternated between the two (which one goes first alternates too), so a busy
machine's load falls on both alike.

``--public`` (issue 31: "the public check stays open for others while one actor floods it"):
the flood is ``--parallel`` public callers, each from its own loopback address, spread over
``--flood-networks`` /24s (127.0.1-N.x), each sending distinct ``--chars``-character texts to
``/v1/public/detect``; meanwhile the others, ``--others`` addresses in 5 other /24s
(127.0.200-204.x), each check 3 distinct texts of >= 200 tokens, one every 0.25 s in turn.
Reports what the others were answered (every check should be 200) and their latency.
``--global-tokens`` lowers the global public budget (settings' public_global_tokens_per_day) so
that a flood empties it within the run. ``--public --rounds N`` (with ``--baseline-repo``
too): N rounds of an idle phase (the others alone) then a flooded one, the others' checks
in a process of their own, each phase ``--others`` x 3 fresh texts; the flood's requests
from ``--flood-addresses`` addresses taken in turn over ``--flood-networks`` networks
(127.1-N.x.y, 250 addresses a /24), as a flood of many addresses would come.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import sys
import time
from pathlib import Path

import httpx

from bench.gateway import cpu_gateway, percentile, provision_store
from keys.lifecycle import create_key
from keys.tenants import create_tenant
from keys.tokens import issue_token
from watermark.spec import WatermarkSpec

MODEL = os.environ.get("HALLMARK_TEST_MODEL", "bundled")


def _provision(tmp: Path) -> tuple[dict[str, str], dict[str, str]]:
    def populate(session, keyring) -> dict[str, str]:
        tokens = {}
        for name in ("flood", "victim"):
            create_tenant(session, name=name, actor="bench")
            create_key(session, keyring, tenant=name, actor="bench", spec=WatermarkSpec(algorithm="dual_key_gumbel"))
            tokens[name] = issue_token(session, tenant=name, actor="bench").raw_token
        return tokens

    return provision_store(tmp, populate)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _run_public(url: str, pid: int, args) -> dict:
    rng = random.Random(31)
    # Mixed-case letters and digits: two 8,000-character texts of lowercase words from 5,000
    # share over 100 of their 5-token windows by chance (the probe guard's bar), and the
    # flood would be refused as one family instead of answered.
    words = ["".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(4, 10))) for _ in range(50000)]
    statuses: dict[str, int] = {}
    answered: dict[str, int] = {}
    latencies: list[float] = []
    rss: list[float] = []
    stop = time.monotonic() + args.seconds
    done = asyncio.Event()

    async def flood(i: int) -> None:
        network = 1 + i % args.flood_networks
        address = f"127.0.{network}.{2 + i // args.flood_networks}"
        transport = httpx.AsyncHTTPTransport(local_address=address)
        async with httpx.AsyncClient(base_url=url, timeout=300, transport=transport) as client:
            while time.monotonic() < stop and not done.is_set():
                # A fresh text each time (its own family: the probe guard does not refuse it).
                text = (" ".join(rng.choices(words, k=args.chars // 5)))[:args.chars]
                r = await client.post("/v1/public/detect", json={"text": text})
                _tally(statuses, r)
                if r.status_code == 429:
                    await asyncio.sleep(0.05)

    def others_sync() -> None:
        time.sleep(args.warmup)  # the flood first
        texts = [" ".join(rng.choices(words, k=60)) for _ in range(3 * args.others)]  # ~270 tokens
        clients = []
        for a in range(args.others):
            address = f"127.0.{200 + a % 5}.{2 + a // 5}"
            clients.append(httpx.Client(base_url=url, timeout=300,
                                        transport=httpx.HTTPTransport(local_address=address)))
        try:
            for j in range(3):
                for a, client in enumerate(clients):
                    _public_check(client, texts[3 * a + j], latencies, answered)
        finally:
            for client in clients:
                client.close()
            done.set()

    async def sample() -> None:
        while not done.is_set():
            rss.append(_rss_mb(pid))
            await asyncio.sleep(0.2)

    await asyncio.gather(*(flood(i) for i in range(args.parallel)), asyncio.to_thread(others_sync), sample())
    return {"flood_statuses": statuses, "others_statuses": answered, "others_checks": len(latencies),
            "others_all_answered": set(answered) == {"200"},
            "others_p50_s": round(percentile(latencies, 0.5), 4), "others_p99_s": round(percentile(latencies, 0.99), 4),
            "others_max_s": round(max(latencies), 4) if latencies else None, "rss_peak_mb": round(max(rss), 1)}


def _tally(statuses: dict[str, int], r) -> None:
    """Count a response by its status, a refusal by its status and error code."""
    key = f"{r.status_code} {r.json()['error']['code']}" if r.status_code >= 400 else str(r.status_code)
    statuses[key] = statuses.get(key, 0) + 1


def _public_check(client, text: str, latencies: list[float], statuses: dict[str, int]) -> None:
    """One other caller's public check: its latency and status (with the error code) recorded,
    then the caller's 0.25 s pause before the next."""
    started = time.perf_counter()
    r = client.post("/v1/public/detect", json={"text": text})
    latencies.append(time.perf_counter() - started)
    _tally(statuses, r)
    time.sleep(0.25)


def _others(url: str, texts: list[list[str]], delay: float, ready, done, out) -> None:
    """The public rounds' other callers (``--public --rounds``), in a process of their own as
    :func:`_victim`: caller ``a`` (127.0.200-204.x) sends ``texts[a]`` one by one, the
    callers in turn, one check every 0.25 s; sets ``done`` at the end."""
    latencies, statuses = [], {}
    clients = [httpx.Client(base_url=url, timeout=300,
                            transport=httpx.HTTPTransport(local_address=f"127.0.{200 + a % 5}.{2 + a // 5}"))
               for a in range(len(texts))]
    try:
        ready.set()
        time.sleep(delay)
        for j in range(max(len(t) for t in texts)):
            for a, client in enumerate(clients):
                if j >= len(texts[a]):
                    continue
                _public_check(client, texts[a][j], latencies, statuses)
    finally:
        for client in clients:
            client.close()
        done.set()
        out.put((latencies, statuses))


async def _public_phase(url: str, pid: int, args, parallel: int, rng, counter: list[int]) -> dict:
    """One public phase: ``--others`` callers' 3 checks each (~270 tokens, fresh texts), beside
    ``parallel`` flooding connections (0: idle). The flood's requests come from
    ``--flood-addresses`` addresses taken in turn (``counter`` carries the turn over phases),
    spread over ``--flood-networks`` networks 127.1-N (250 addresses a /24), each request a
    fresh ``--chars``-character text on a connection of its own; the flood starts a second
    before the others and stops with them."""
    import multiprocessing

    texts = [[" ".join(rng.choices(PUBLIC_WORDS, k=60)) for _ in range(3)] for _ in range(args.others)]
    statuses: dict[str, int] = {}
    context = multiprocessing.get_context("spawn")
    out, ready, finished = context.Queue(), context.Event(), context.Event()
    others = context.Process(target=_others, args=(url, texts, 1.0, ready, finished, out))
    others.start()
    await asyncio.to_thread(ready.wait)
    cpu_before = _cpu_seconds(pid)
    started = time.monotonic()
    addresses = max(args.flood_addresses or parallel, 1)

    def address(n: int) -> str:
        network, host = n % args.flood_networks, n // args.flood_networks
        return f"127.{1 + network}.{host // 250}.{2 + host % 250}"

    async def flood() -> None:
        while not finished.is_set():
            n = counter[0] % addresses
            counter[0] += 1
            text = (" ".join(rng.choices(PUBLIC_WORDS, k=args.chars // 5)))[:args.chars]
            transport = httpx.AsyncHTTPTransport(local_address=address(n))
            async with httpx.AsyncClient(base_url=url, timeout=300, transport=transport) as client:
                r = await client.post("/v1/public/detect", json={"text": text})
            _tally(statuses, r)
            if r.status_code == 429:
                await asyncio.sleep(0.05)

    await asyncio.gather(*(flood() for _ in range(parallel)))
    latencies, answered = await asyncio.to_thread(out.get)
    others.join()
    cpu_after = _cpu_seconds(pid)
    return {"parallel": parallel, "victim_checks": len(latencies), "victim_statuses": answered,
            "others_all_answered": set(answered) == {"200"},
            "victim_p50_s": round(percentile(latencies, 0.5), 4), "victim_p99_s": round(percentile(latencies, 0.99), 4),
            "victim_max_s": round(max(latencies), 4) if latencies else None,
            "victim_latencies_s": [round(x, 4) for x in latencies], "flood_statuses": statuses,
            "gateway_cpu_s": round(cpu_after[0] - cpu_before[0], 2),
            "workers_cpu_s": round(cpu_after[1] - cpu_before[1], 2), "seconds": round(time.monotonic() - started, 1),
            "load_average": os.getloadavg()[0]}


def _victim(url: str, token: str, seconds: float, delay: float, ready, done, out) -> None:
    """The victim tenant's checks, in a process of its own: in the flood's process its
    thread waited for the interpreter behind the flood's body encoding (measured the client,
    not the gateway). Sets ``ready`` once started (the flood then starts), waits ``delay``,
    sends an 11-character check every 0.25 s for ``seconds``, then sets ``done`` (the flood
    stops)."""
    latencies, statuses = [], {}
    with httpx.Client(base_url=url, timeout=300) as own:
        ready.set()
        time.sleep(delay)
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            started = time.perf_counter()
            r = own.post("/v1/detect", json={"text": f"hello wo {len(latencies):02d}"[-11:]},
                         headers={"Authorization": f"Bearer {token}"})
            latencies.append(time.perf_counter() - started)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            time.sleep(0.25)
    done.set()
    out.put((latencies, statuses))


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) so far of the gateway's process and of its children (the
    offload workers)."""
    import psutil

    process = psutil.Process(pid)
    own = sum(process.cpu_times()[:2])
    children = 0.0
    for child in process.children(recursive=True):
        try:
            children += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return own, children


async def _phase(url: str, tokens: dict[str, str], pid: int, args, parallel: int, rng) -> dict:
    """One phase: the victim's checks for ``args.seconds``, beside ``parallel`` flooding
    connections (0: idle). The flood starts a second before the victim and stops with it."""
    import multiprocessing

    import numpy

    ids = numpy.random.default_rng(rng.randrange(2**32))

    def flood_body() -> bytes:
        # Distinct bodies (one body sent again is the probe guard's, and a flooding tenant would
        # not make it that easy), made cheaply: the client spends its CPU on sending.
        if args.ids:  # issue 31: a stream of token-id bodies (<= 8,000)
            return json.dumps({"token_ids": ids.integers(300, 8000, args.ids).tolist()}).encode()
        return json.dumps({"text": " ".join(rng.choices(WORDS, k=args.chars // 5))[:args.chars]}).encode()

    statuses: dict[str, int] = {}
    context = multiprocessing.get_context("spawn")
    out, ready, finished = context.Queue(), context.Event(), context.Event()
    victim = context.Process(target=_victim, args=(url, tokens["victim"], args.seconds, 1.0, ready, finished, out))
    victim.start()
    await asyncio.to_thread(ready.wait)  # its imports done: the flood starts a second before its checks
    cpu_before = _cpu_seconds(pid)
    started = time.monotonic()
    limits = httpx.Limits(max_connections=parallel + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        async def flood() -> None:
            while not finished.is_set():
                r = await client.post("/v1/detect", content=flood_body(),
                                      headers={"Authorization": f"Bearer {tokens['flood']}",
                                               "Content-Type": "application/json"})
                _tally(statuses, r)
                if r.status_code == 429:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(flood() for _ in range(parallel)))
    latencies, victim_status = await asyncio.to_thread(out.get)
    victim.join()
    elapsed = time.monotonic() - started
    cpu_after = _cpu_seconds(pid)
    return {"parallel": parallel, "victim_checks": len(latencies), "victim_statuses": victim_status,
            "victim_p50_s": round(percentile(latencies, 0.5), 4), "victim_p99_s": round(percentile(latencies, 0.99), 4),
            "victim_max_s": round(max(latencies), 4) if latencies else None,
            "victim_latencies_s": [round(x, 4) for x in latencies], "flood_statuses": statuses,
            "gateway_cpu_s": round(cpu_after[0] - cpu_before[0], 2),
            "workers_cpu_s": round(cpu_after[1] - cpu_before[1], 2), "seconds": round(elapsed, 1),
            "load_average": os.getloadavg()[0]}


async def _run(url: str, tokens: dict[str, str], pid: int, args) -> dict:
    """``args.rounds`` rounds of an idle phase then a flooded one, on one gateway. Each round
    its own bodies (``args.first_round``: the round this call begins with): one round's
    bodies sent again in another are the probe guard's repeated checks (429 probe_guard),
    not a flood of detections."""
    rng = random.Random(25 + 1000 * getattr(args, "first_round", 0))
    rounds = []
    counter = [0]
    for r in range(args.rounds):
        if args.public:
            idle = await _public_phase(url, pid, args, 0, rng, counter) if args.idle else None
            flooded = await _public_phase(url, pid, args, args.parallel, rng, counter) if args.parallel else None
        else:
            idle = await _phase(url, tokens, pid, args, 0, rng) if args.idle else None
            flooded = await _phase(url, tokens, pid, args, args.parallel, rng) if args.parallel else None
        row = {"idle": idle, "flooded": flooded}
        if idle and flooded:
            row["p99_ratio"] = round(flooded["victim_p99_s"] / idle["victim_p99_s"], 2)
        rounds.append(row)
        print(json.dumps({"round": r, **{k: (v if not isinstance(v, dict) else {
            f: v[f] for f in ("victim_checks", "victim_p50_s", "victim_p99_s", "flood_statuses",
                              "gateway_cpu_s", "workers_cpu_s", "load_average")}) for k, v in row.items()}}),
              file=sys.stderr, flush=True)
    return {"rounds": rounds, "p99_ratios": [row.get("p99_ratio") for row in rounds]}


WORDS = ["".join(random.Random(25 + i).choices(string.ascii_lowercase, k=2 + i % 8)) for i in range(5000)]
PUBLIC_WORDS = ["".join(random.Random(31 + i).choices(string.ascii_letters + string.digits, k=4 + i % 7))
                for i in range(50000)]
"""Mixed-case letters and digits (as :func:`_run_public`'s): texts of them share no 5-token
windows by chance, so each check is its own probe family."""


def _warm(server, tokens: dict[str, str], args) -> None:
    # Warm: one small detection per tenant (tokenizer, keys, caches).
    for name in tokens:
        httpx.post(server.url + "/v1/detect", json={"text": "warm up"},
                   headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=120)
    # A large body too: a worker process (service.access.offload) is started and warm.
    httpx.post(server.url + "/v1/detect", json={"token_ids": list(range(300, 3300))},
               headers={"Authorization": f"Bearer {tokens['flood']}"} if "flood" in tokens else {}, timeout=300)
    if args.public:  # the public path warm too (tokenizer forms, the sketch, the worker)
        httpx.post(server.url + "/v1/public/detect", json={"text": "warm up " * 2000}, timeout=120)
    time.sleep(1)


def _compare(args) -> dict:
    """This tree's gateway and ``--baseline-repo``'s, both started (each its own store), the
    rounds alternated between them (which goes first alternates too): a busy machine's
    load falls on both alike."""
    import tempfile

    from bench.gateway import Gateway

    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        try:
            for arm, repo in (("this", None), ("baseline", args.baseline_repo)):
                folder = Path(tmp) / arm
                folder.mkdir()
                env, tokens = _provision(folder)
                env = {**os.environ, **env, "HALLMARK_MODEL": MODEL, "HALLMARK_DEVICE": "cpu",
                       "HALLMARK_DRAFT_MODEL": ""}
                server = Gateway(env, folder / "gateway.log", **({"repo": repo} if repo else {}))
                servers[arm] = (server, tokens)
            for server, tokens in servers.values():
                server.wait_ready()
                _warm(server, tokens, args)
            out: dict[str, list] = {arm: [] for arm in servers}
            order = list(servers)
            for r in range(args.rounds):
                for arm in (order if r % 2 == 0 else order[::-1]):
                    server, tokens = servers[arm]
                    one = argparse.Namespace(**{**vars(args), "rounds": 1, "first_round": r})
                    row = asyncio.run(_run(server.url, tokens, server.process.pid, one))["rounds"][0]
                    row["round"] = r
                    out[arm].append(row)
                    print(json.dumps({"arm": arm, "round": r, "p99_ratio": row.get("p99_ratio")}), file=sys.stderr,
                          flush=True)
        finally:
            for server, _ in servers.values():
                server.stop()
    return {"arms": out, "p99_ratios": {arm: [row.get("p99_ratio") for row in rows] for arm, rows in out.items()},
            "baseline_repo": str(args.baseline_repo)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parallel", type=int, default=24)
    parser.add_argument("--chars", type=int, default=190_000)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--ids", type=int, default=0, help="flood with this many random token ids a body instead")
    parser.add_argument("--out", type=Path, default=Path("bench/results/detect-flood.json"))
    parser.add_argument("--public", action="store_true", help="flood the public check from many addresses")
    parser.add_argument("--flood-networks", type=int, default=1, help="with --public: /24s the flood's addresses span")
    parser.add_argument("--others", type=int, default=30, help="with --public: other addresses, 3 checks each")
    parser.add_argument("--flood-addresses", type=int, default=0,
                        help="with --public --rounds: addresses the flood's requests take in turn (default --parallel)")
    parser.add_argument("--warmup", type=float, default=3.0, help="with --public: seconds of flood before the others")
    parser.add_argument("--global-tokens", type=float, default=None,
                        help="the global public budget a day (HALLMARK_PUBLIC_GLOBAL_TOKENS_PER_DAY)")
    parser.add_argument("--workers", type=int, default=None, help="HALLMARK_DETECT_WORKERS (0: worker threads)")
    parser.add_argument("--rounds", type=int, default=1, help="tenant flood: rounds of an idle then a flooded phase")
    parser.add_argument("--baseline-repo", type=Path, default=None,
                        help="tenant flood: also a gateway of this tree's code, rounds alternated with this one's")
    parser.add_argument("--no-idle", dest="idle", action="store_false", help="tenant flood: no idle phases")
    args = parser.parse_args()
    if args.global_tokens is not None:
        os.environ["HALLMARK_PUBLIC_GLOBAL_TOKENS_PER_DAY"] = str(args.global_tokens)
    if args.workers is not None:
        os.environ["HALLMARK_DETECT_WORKERS"] = str(args.workers)
    if args.rounds > 1 and not args.public:
        # Rounds of 8,000-id bodies pass the flood tenant's daily budget (2 M tokens, 250 of
        # them): the flood would be refused, not detected, in the later rounds.
        os.environ.setdefault("HALLMARK_TENANT_DETECT_TOKENS_PER_DAY", "1e9")
    if args.baseline_repo is not None and (args.rounds > 1 or not args.public):
        result = _compare(args)
        before = float("nan")
    else:
        with cpu_gateway(_provision, MODEL) as (server, tokens):
            pid = server.process.pid
            _warm(server, tokens, args)
            before = _rss_mb(pid)
            result = asyncio.run(_run_public(server.url, pid, args) if args.public and args.rounds <= 1
                                 else _run(server.url, tokens, pid, args))
    if "rss_peak_mb" in result:
        result["rss_growth_mb"] = round(result["rss_peak_mb"] - before, 1)
    result = {"rss_before_mb": round(before, 1), **result,
              "parallel": args.parallel, "chars": args.chars, "seconds": args.seconds,
              "ids": args.ids, "workers": os.environ.get("HALLMARK_DETECT_WORKERS", "default"),
              "command": " ".join([".venv/bin/python -m bench.detect_flood", *sys.argv[1:]]),
              "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
