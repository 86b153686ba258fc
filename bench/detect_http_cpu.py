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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extra = ("--workers", str(args.workers)) if args.workers > 1 else ()
        repo = REPO if args.tree is None else args.tree.resolve()
        tree = detect_http._Tree(str(repo), repo, Path(tmp) / "this", extra)
        server = Gateway(tree.env, Path(tmp) / "gateway.log", repo=tree.repo, args=tree.args)
        try:
            server.wait_ready()
            texts = detect_http._generate(server.url, tree.token)
            bodies = [{"text": t} for t in (edited.variants(texts, args.distinct) if args.distinct else texts)]
            asyncio.run(detect_http._load(server.port, tree.detect_token, bodies, args.clients, args.warmup, 0.0))
            before, load = _cpu(server.process.pid), os.getloadavg()[0]
            latencies, errors = asyncio.run(detect_http._load(server.port, tree.detect_token, bodies, args.clients,
                                                              args.seconds, 0.0))
            spent = _cpu(server.process.pid) - before
        finally:
            server.stop(30)
    row = {"label": args.label, "tree": str(repo), "requests": len(latencies), "errors": errors,
           "requests_per_second": len(latencies) / args.seconds,
           "server_cpu_ms_per_request": round(spent / max(1, len(latencies)) * 1e3, 3),
           "load_average_1min_before": round(load, 2), "distinct_texts": args.distinct, "workers": args.workers,
           "clients": args.clients}
    rows.emit(row, args.out)


if __name__ == "__main__":
    main()
