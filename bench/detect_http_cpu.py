"""Server CPU time per `/v1/detect` request under bench.detect_http's load: the same gateway,
store, texts and 16 keep-alive clients, but the figure is the gateway's own CPU seconds
(every worker process, user + system, from psutil) per answered request, which a shared,
loaded machine disturbs far less than requests per second.

    .venv/bin/python -m bench.detect_http_cpu [--seconds 10] [--workers 2] [--out FILE]

Runs against whichever tree is on PYTHONPATH (another tree's code: PYTHONPATH=that tree,
this file copied into its bench/), for before/after comparisons on a busy box.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

import psutil

from bench import detect_http, edited, rows
from bench.gateway import REPO, Gateway


def _cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _core(server: Gateway, path: Path) -> dict:
    """The gateway's core CPU totals so far (bench/core_cpu/sitecustomize.py, on SIGUSR1)."""
    import signal
    import time

    seen = len(path.read_text().splitlines()) if path.exists() else 0
    server.process.send_signal(signal.SIGUSR1)
    for _ in range(200):
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) > seen:
            return json.loads(lines[-1])
        time.sleep(0.05)
    raise SystemExit("the gateway wrote no core CPU totals (was it started with bench/core_cpu on PYTHONPATH?)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default=None, help="append one JSON line")
    parser.add_argument("--tree", type=Path, default=None,
                        help="serve another worktree's code (as bench.detect_http --compare does)")
    parser.add_argument("--distinct", type=int, default=0,
                        help="this many distinct texts (generations with 3 words changed: bench.edited)")
    parser.add_argument("--core", action="store_true",
                        help="also the detection core's own CPU in the gateway (thread time inside "
                             "service.detection.detect, counted by bench/core_cpu/sitecustomize.py; --workers 1), "
                             "and the server's CPU less it per request")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extra = ("--workers", str(args.workers)) if args.workers > 1 else ()
        repo = REPO if args.tree is None else args.tree.resolve()
        tree = detect_http._Tree(str(repo), repo, Path(tmp) / "this", extra)
        core_file = Path(tmp) / "core.jsonl"
        env = tree.env
        if args.core:
            env = {**env, "HALLMARK_BENCH_CORE_CPU": str(core_file),
                   "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "core_cpu"), str(repo)])}
        server = Gateway(env, Path(tmp) / "gateway.log", repo=tree.repo, args=tree.args)
        try:
            server.wait_ready()
            texts = detect_http._generate(server.url, tree.token)
            bodies = [{"text": t} for t in (edited.variants(texts, args.distinct) if args.distinct else texts)]
            asyncio.run(detect_http._load(server.port, tree.detect_token, bodies, args.clients, args.warmup, 0.0))
            core_before = _core(server, core_file) if args.core else None
            before, load = _cpu(server.process.pid), os.getloadavg()[0]
            latencies, errors = asyncio.run(detect_http._load(server.port, tree.detect_token, bodies, args.clients,
                                                              args.seconds, 0.0))
            spent = _cpu(server.process.pid) - before
            core_after = _core(server, core_file) if args.core else None
        finally:
            server.stop(30)
    row = {"label": args.label, "tree": str(repo), "requests": len(latencies), "errors": errors,
           "requests_per_second": len(latencies) / args.seconds,
           "server_cpu_ms_per_request": round(spent / max(1, len(latencies)) * 1e3, 3),
           "load_average_1min_before": round(load, 2), "distinct_texts": args.distinct, "workers": args.workers,
           "clients": args.clients}
    if args.core:
        core_seconds = core_after["seconds"] - core_before["seconds"]
        calls = max(1, core_after["calls"] - core_before["calls"])
        row["core_cpu_ms_per_request"] = round(core_seconds / calls * 1e3, 3)
        row["server_cpu_minus_core_ms_per_request"] = round((spent - core_seconds) / max(1, len(latencies)) * 1e3, 3)
    rows.emit(row, args.out)


if __name__ == "__main__":
    main()
