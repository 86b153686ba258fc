"""Loaded by a benchmarked gateway (bench.detect_http_cpu --core, through PYTHONPATH) to count
the CPU the detection core spends in it: `service.detection.detect` is wrapped to add its
thread time, and SIGUSR1 writes the totals so far (seconds, calls) to $HALLMARK_BENCH_CORE_CPU
as one JSON line. Nothing of it is in the product; only a bench puts this folder on the path."""

import json
import os
import signal
import time

_OUT = os.environ.get("HALLMARK_BENCH_CORE_CPU")
if _OUT:
    _totals = {"seconds": 0.0, "calls": 0}

    def _install() -> None:
        from service import detection

        real = detection.detect

        def counted(*args, **kwargs):
            start = time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                _totals["seconds"] += time.thread_time() - start
                _totals["calls"] += 1

        detection.detect = counted

    def _report(signum, frame) -> None:
        with open(_OUT, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), **_totals}) + "\n")

    _install()
    signal.signal(signal.SIGUSR1, _report)
