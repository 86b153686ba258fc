"""`hallmark serve --workers 2`: two worker processes answer on one port, detection gives
the same result through either, and SIGTERM to the supervisor stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.service import gateway
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    status = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(status) and not status.startswith("Z")


@contextmanager
def _serving(tmp_path):
    """`hallmark serve --workers 2` on a free port: (supervisor, its two workers, url, tokens)."""
    store_settings, tokens = gateway.provision(tmp_path, secrets=gateway.FIXED_SECRETS)
    port = gateway._free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HALLMARK_DATABASE_URL": store_settings.database_url,
           "HALLMARK_KEK_FILE": str(store_settings.kek_file), "HALLMARK_MODEL": TEST_MODEL,
           "HALLMARK_DRAFT_MODEL": TEST_DRAFT, "HALLMARK_DEVICE": "cpu"}
    log = open(tmp_path / "serve.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "2"],
                               cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            workers = _children(process.pid)
            try:
                if len(workers) == 2 and httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert len(workers) == 2, (tmp_path / "serve.log").read_text()[-3000:]
        yield process, workers, url, tokens
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in workers:  # never leave a worker behind, whatever the test did
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        log.close()


def test_two_workers_share_the_port_and_stop_together(tmp_path):
    with _serving(tmp_path) as (process, workers, url, tokens):
        headers = {"Authorization": f"Bearer {tokens['acme']}"}
        out = httpx.post(url + "/v1/generate", headers=headers, timeout=300,
                         json={"prompt": "The function returns", "max_tokens": 60, "seed": 1}).json()
        results = []
        # The operator tier (admin token): twelve checks of one text are what the probe guard
        # refuses to a tenant token (service/access), and this test is about the workers.
        admin = {"Authorization": f"Bearer {tokens['admin']}"}
        for _ in range(12):  # a new connection each time: the kernel spreads them over both workers
            r = httpx.post(url + "/v1/detect", headers=admin, json={"text": out["text"], "tenant": "acme"}, timeout=60)
            assert r.status_code == 200, r.text
            body = r.json()
            results.append((body["watermarked"], body["log10_p_value"], len(body["ledger_matches"]),
                            body["report"] is not None))
        assert len(set(results)) == 1 and results[0][2] == 1  # the same answer, the generation cited
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert not any(_alive(pid) for pid in workers)


def test_workers_end_when_the_supervisor_is_killed(tmp_path):
    """SIGKILL gives the supervisor no chance to pass anything on: the workers must still end
    (else they go on answering on the port with nobody to stop them)."""
    with _serving(tmp_path) as (process, workers, url, tokens):
        process.kill()
        process.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.5)
        assert not any(_alive(pid) for pid in workers)
