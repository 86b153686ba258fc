"""`hallmark serve --workers 2`: two worker processes answer on one port, detection gives
the same result through either, and SIGTERM to the supervisor stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.service import gateway
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_two_workers_share_the_port_and_stop_together(tmp_path):
    store_settings, tokens = gateway.provision(tmp_path, secrets=gateway.FIXED_SECRETS)
    port = gateway._free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HALLMARK_DATABASE_URL": store_settings.database_url,
           "HALLMARK_KEK_FILE": str(store_settings.kek_file), "HALLMARK_MODEL": TEST_MODEL,
           "HALLMARK_DRAFT_MODEL": TEST_DRAFT, "HALLMARK_DEVICE": "cpu"}
    log = open(tmp_path / "serve.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "2"],
                               cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        workers = set()
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
        headers = {"Authorization": f"Bearer {tokens['acme']}"}
        out = httpx.post(url + "/v1/generate", headers=headers, timeout=300,
                         json={"prompt": "The function returns", "max_tokens": 60, "seed": 1}).json()
        results = []
        for _ in range(12):  # a new connection each time: the kernel spreads them over both workers
            r = httpx.post(url + "/v1/detect", headers=headers, json={"text": out["text"]}, timeout=60)
            assert r.status_code == 200, r.text
            body = r.json()
            results.append((body["watermarked"], body["log10_p_value"], len(body["ledger_matches"]),
                            body["report"] is not None))
        assert len(set(results)) == 1 and results[0][2] == 1  # the same answer, the generation cited
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        for pid in workers:
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            assert not alive
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
