"""What the gateway spends on a `/v1/detect` request around the detection core: the whole ASGI
app (every middleware, routing, authentication, body parsing, the access gate, its audited
write, the response) driven in process, with no sockets, against the CPU of
`service.detection.detect` itself.

    .venv/bin/python -m bench.detect_asgi [--requests 400] [--clients 16] [--profile] [--out FILE]

A fresh SQLite store (one tenant, one dual-key key imported from a fixed secret, the
tenant's generations recorded in its ledger) and the gateway app as `hallmark serve` builds
it; ``--clients`` concurrent requests at a time on one event loop, each a distinct text
(bench.edited), with an expert token (every request audited). Prints the process's CPU per
request (every thread: the writes' thread's commits too), the core's CPU per request
(thread time inside `service.detection.detect`) and their difference, the gateway's own
cost in process; HTTP parsing and the socket (uvicorn, httptools) are not in it
(`bench.detect_http_cpu` measures the server process whole). ``--profile``: cProfile's top
functions outside the core.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import cProfile  # noqa: E402
import copy  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench import detect_setup, edited, rows  # noqa: E402


def _scope(path: str, token: str, length: int) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
            "headers": [(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {token}".encode()),
                        (b"content-type", b"application/json"), (b"content-length", str(length).encode())]}


async def _request(app, token: str, payload: bytes) -> tuple[int, bytes]:
    sent = False
    status, chunks = 0, []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.Event().wait()  # the client stays: no disconnect

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(_scope("/v1/detect", token, len(payload)), receive, send)
    return status, b"".join(chunks)


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each of this process's threads, by name (names summed)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            name = names.get(int(tid)) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def access_held(app) -> str | None:
    access = getattr(getattr(app.state, "services", None), "_access", None)
    held = getattr(access, "audits", None)
    return f"{held.items} in {held.flushes} commits" if held is not None and held.flushes else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of --requests (median reported)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=50)
    parser.add_argument("--profile-out", default=None, help="with --profile: also save the cProfile stats here")
    parser.add_argument("--out", default=None, help="append a JSON line with the figures")
    parser.add_argument("--label", default="")
    parser.add_argument("--stub-core", action="store_true",
                        help="the core answers a copy of one real result (its CPU still subtracted): the gateway's "
                             "own cost alone, far less disturbed by a busy machine, and a profile without the core")
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from bench.gateway import provision_store
    from keys.settings import StoreSettings
    from service import detection
    from service.app import create_app
    from service.settings import ServiceSettings

    with tempfile.TemporaryDirectory() as tmp:
        env, tokens = provision_store(Path(tmp), detect_setup.populate())
        store_settings = StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=env["HALLMARK_KEK_FILE"])
        settings = ServiceSettings(detect_rate_per_minute=1e9, detect_burst=1_000_000_000)
        app = create_app(settings, store_settings=store_settings)
        with TestClient(app) as client:  # the lifespan: the store, the engine, the warm-up
            texts = detect_setup.generated_texts(client, tokens["tenant"], 8)
        # The app again on this thread's own loop (TestClient's portal runs it on another thread).
        app = create_app(settings, store_settings=store_settings)
        bodies = iter([json.dumps({"text": t}).encode()
                       for t in edited.variants(texts, args.requests * (args.rounds + 2) + args.clients)])
        core = {"cpu": 0.0, "calls": 0}
        real = detection.detect

        canned = []

        def stub(*a, **k):
            if not canned:
                canned.append(real(*a, **k))
            return copy.deepcopy(canned[0])

        core_fn = stub if args.stub_core else real

        def timed(*a, **k):
            start = time.thread_time()
            try:
                return core_fn(*a, **k)
            finally:
                core["cpu"] += time.thread_time() - start
                core["calls"] += 1

        detection.detect = timed

        in_flight = [0]
        try:
            from service.access import group_commit

            group_commit.in_flight = lambda: in_flight[0]
        except (ImportError, AttributeError):
            pass

        async def batch(n: int) -> None:
            queue = iter(range(n))

            async def client_loop() -> None:
                for _ in queue:
                    in_flight[0] += 1  # as uvicorn counts a request from its headers to its answer
                    try:
                        status, body = await _request(app, tokens["expert"], next(bodies))
                    finally:
                        in_flight[0] -= 1
                    assert status == 200, body[:300]

            await asyncio.gather(*(client_loop() for _ in range(args.clients)))

        async def run() -> list[dict]:
            messages = asyncio.Queue()

            async def lifespan_receive():
                return await messages.get()

            started = asyncio.Event()

            async def lifespan_send(message):
                if message["type"] == "lifespan.startup.complete":
                    started.set()
                elif message["type"].endswith("failed"):
                    raise SystemExit(message)

            life = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan_receive,
                                           lifespan_send))
            await messages.put({"type": "lifespan.startup"})
            await started.wait()
            await batch(args.requests)  # warm
            results = []
            threads_before = _thread_cpu()
            for _ in range(args.rounds):
                core.update(cpu=0.0, calls=0)
                start, wall = time.process_time(), time.perf_counter()
                await batch(args.requests)
                total = time.process_time() - start
                results.append({"total": total / args.requests * 1e3, "core": core["cpu"] / core["calls"] * 1e3,
                                "wall": (time.perf_counter() - wall) / args.requests * 1e3})
            threads_after = _thread_cpu()
            spent = {name: round((threads_after[name] - threads_before.get(name, 0.0)) / (args.rounds * args.requests)
                                 * 1e3, 3) for name in threads_after}
            results[-1]["threads"] = {k: v for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v > 0.001}
            print("CPU ms per request by thread:", results[-1]["threads"])
            print("audit events held together:", access_held(app))
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                await batch(args.requests)
                profiler.disable()
                if args.profile_out:
                    profiler.dump_stats(args.profile_out)
                buffer = io.StringIO()
                pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(args.top)
                print(buffer.getvalue())
                buffer = io.StringIO()
                pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(args.top)
                print(buffer.getvalue())
            await messages.put({"type": "lifespan.shutdown"})
            await life
            return results

        results = asyncio.run(run())
        detection.detect = real
    median = lambda key: round(statistics.median(r[key] for r in results), 3)  # noqa: E731
    row = {"label": args.label, "requests": args.requests, "clients": args.clients, "rounds": args.rounds,
           "process_cpu_ms_per_request": median("total"), "core_cpu_ms_per_request": median("core"),
           "gateway_minus_core_ms": round(statistics.median(r["total"] - r["core"] for r in results), 3),
           "wall_ms_per_request": median("wall"), "load_average_1min": round(os.getloadavg()[0], 2)}
    rows.emit(row, args.out)


if __name__ == "__main__":
    main()
