"""Loaded by a benchmarked gateway (bench.detect_http --probe, through PYTHONPATH) to find what
stalls its event loop: every garbage collection (generation, start, duration), every key cache
load (service.caching.TTLCache.get_or_load's ``load``: key, start, duration, thread), and the
loop's lag (a task that asks to wake every 2 ms, and records when it woke more than 5 ms late).
SIGUSR1 appends all of it so far to $HALLMARK_BENCH_STALLS as one JSON line (times are
time.perf_counter()'s, which the bench's client shares on this machine). Nothing of it is in
the product; only a bench puts this folder on the path."""

import gc
import json
import os
import signal
import threading
import time

_OUT = os.environ.get("HALLMARK_BENCH_STALLS")
if _OUT:
    _events = {"gc": [], "loads": [], "lags": [], "pid": os.getpid()}
    _gc_start = [0.0]

    def _on_gc(phase, info) -> None:
        if phase == "start":
            _gc_start[0] = time.perf_counter()
        else:
            end = time.perf_counter()
            _events["gc"].append((info["generation"], _gc_start[0], end - _gc_start[0], info.get("collected", 0)))

    gc.callbacks.append(_on_gc)

    def _install() -> None:
        import asyncio

        from service import app, caching

        real_get_or_load = caching.TTLCache.get_or_load

        def get_or_load(self, key, load):
            def timed():
                start = time.perf_counter()
                try:
                    return load()
                finally:
                    _events["loads"].append((repr(key)[:60], start, time.perf_counter() - start,
                                             threading.current_thread().name))
            return real_get_or_load(self, key, timed)

        caching.TTLCache.get_or_load = get_or_load

        real_publish = app._publish_checkpoints

        async def lag_probe() -> None:
            period = 0.002
            while True:
                asked = time.perf_counter()
                await asyncio.sleep(period)
                woke = time.perf_counter()
                late = woke - asked - period
                if late > 0.005:
                    _events["lags"].append((asked, late))

        async def publish_and_probe(services):
            probe = asyncio.create_task(lag_probe())
            try:
                await real_publish(services)
            finally:
                probe.cancel()

        app._publish_checkpoints = publish_and_probe

    def _report(signum, frame) -> None:
        with open(_OUT, "a") as out:
            out.write(json.dumps(_events) + "\n")

    _install()
    signal.signal(signal.SIGUSR1, _report)
