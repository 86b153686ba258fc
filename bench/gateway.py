"""A `hallmark serve` process for the HTTP benchmarks: start it, wait until ready, stop it,
and the latency percentile they all report."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """One gateway process on a free loopback port, its stderr in ``log``."""

    def __init__(self, env: dict[str, str], log: Path, *, port: int | None = None, repo: Path = REPO,
                 args: tuple[str, ...] = ()) -> None:
        """``repo``: the tree whose code serves (another worktree: an older commit, compared);
        ``args``: more `hallmark serve` options (``--workers 2``)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        if repo != REPO and not env.get("PYTHONPATH", "").endswith(str(repo)):
            # its own code, not this tree's (nor the venv's editable install); a path that
            # already ends with it (bench.detect_http_cpu --core puts a folder before it) stays
            env = {**env, "PYTHONPATH": str(repo)}
        with open(log, "a") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(self.port),
                                             *args], cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=stderr)

    def wait_ready(self, timeout: float = 300) -> None:
        """Poll /readyz; SystemExit with the log's tail if the process dies or never gets ready."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("the gateway did not start: " + self.log.read_text()[-3000:])
            time.sleep(0.5)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (the gateway closes its streams' records), SIGKILL after ``timeout``."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (nan when empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def provision_store(tmp: Path, populate) -> tuple[dict[str, str], dict[str, str]]:
    """A new SQLite store under ``tmp`` with its own KEK file, migrated, then
    ``populate(session, keyring)`` (returning the tokens it issued) in one transaction:
    (the gateway's environment for that store, the tokens)."""
    from keys import migrate
    from keys.db import open_store
    from keys.kek import generate_kek_file
    from keys.settings import StoreSettings

    kek = tmp / "kek.key"
    generate_kek_file(kek)
    env = {"HALLMARK_DATABASE_URL": f"sqlite:///{tmp / 'hallmark.db'}", "HALLMARK_KEK_FILE": str(kek)}
    store = open_store(StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=kek), require_kek=True,
                       check_schema=False, create=True)
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            tokens = populate(session, store.keyring)
    finally:
        store.close()
    return env, tokens


@contextlib.contextmanager
def cpu_gateway(provision, model: str):
    """A gateway process on the CPU, without a draft model, over the store ``provision(tmp)``
    makes (returning its environment and tokens) in a temporary directory: yields (gateway,
    tokens) once it is ready, and stops it at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        env, tokens = provision(Path(tmp))
        env = {**os.environ, **env, "HALLMARK_MODEL": model, "HALLMARK_DEVICE": "cpu", "HALLMARK_DRAFT_MODEL": ""}
        server = Gateway(env, Path(tmp) / "gateway.log")
        try:
            server.wait_ready()
            yield server, tokens
        finally:
            server.stop()
