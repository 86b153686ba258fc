"""`hallmark serve --workers N`: N gateway processes answering on one listening socket.

Detection is CPU-bound Python, so one process uses one core whatever its threads do (the
GIL). The supervisor binds the port (:mod:`service.cli.listen`), then forks the workers
before anything starts a thread or loads a model; each worker builds its own app (its own
engine, store connections and caches) and accepts on the inherited sockets, the kernel
spreading connections among them.

What a worker holds for itself, and what that means with N of them:

* the key, token and signer caches (:mod:`service.caching`): as N replicas, each entry lives
  ``key_cache_seconds``, so a revoked token or a rotated key takes effect within that time in
  every worker;
* rate-limit buckets: shared through the database or Redis (``rate_limit_backend``); with the
  ``memory`` backend (the default on SQLite) each worker has its own, so a token's detection
  budget is N times the setting (a warning says so at start);
* Prometheus metrics: each worker counts its own requests; ``/metrics`` answers with the
  figures of the worker that took the scrape;
* the signing key and the transparency log: in the database, as for replicas (each worker
  publishes checkpoints of what it appended; the start-up steps retry when two collide).

A worker that exits stops the others: a gateway answering on some workers only would fail
requests at random. SIGTERM and SIGINT to the supervisor are passed on to every worker.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

log = logging.getLogger("hallmark.app")


def fork_workers(count: int) -> int | None:
    """In each of ``count`` forked workers: its number (0 to count - 1), to go on serving.
    In the supervisor (this process): None once every worker has exited (SystemExit with the
    first failing worker's status, if one failed)."""
    children: dict[int, int] = {}
    parent = os.getpid()
    for number in range(count):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            _end_with(parent)
            return number
        children[pid] = number

    asked: set[int] = set()  # signals the supervisor passed on: workers may end by them (uvicorn re-raises)

    def forward(signum, _frame) -> None:
        asked.add(signum)
        for pid in list(children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    stopping = False
    while children:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        children.pop(pid, None)
        code = os.waitstatus_to_exitcode(code)
        if code < 0 and -code in asked:  # stopped as asked
            code = 0
        if code != 0 and status == 0:
            status = code if code > 0 else 1
        if not stopping and children:  # one worker gone: stop the others
            stopping = True
            forward(signal.SIGTERM, None)
    if status:
        sys.exit(status)
    return None


def _end_with(parent: int) -> None:
    """SIGTERM to this worker when the supervisor dies, however it dies (SIGKILL, OOM): else
    the workers would go on answering on the port with nobody to stop them (seen: a killed
    supervisor left both workers running). Linux's PR_SET_PDEATHSIG; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the supervisor died before the line above
        os._exit(1)
