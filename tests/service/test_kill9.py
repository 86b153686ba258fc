"""kill -9 mid-stream: a real `hallmark serve` subprocess (bundled local engine), a real
streaming client, SIGKILL, a restart on the same database. The record then shows the
generation as interrupted, covering the tokens the client received up to at most 32
(the checkpoint interval), and its hashes commit to exactly that prefix."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ledger.chain import hash_token_ids
from ledger.entries import CHECKPOINT_TOKENS, hash_output
from tests.service import gateway as gw

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp: Path, settings, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALLMARK_")}
    env.update(PYTHONPATH=str(REPO), HALLMARK_DATABASE_URL=settings.database_url,
               HALLMARK_KEK_FILE=str(settings.kek_file), HALLMARK_DEVICE="cpu", HALLMARK_MAX_TOKENS_CAP="1024")
    log = open(tmp / f"serve-{port}.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port),
                                "--model", gw.TEST_MODEL, "--draft-model", ""],
                               env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    deadline = time.time() + 240
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError((tmp / f"serve-{port}.log").read_text()[-2000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError("the server did not become ready")


def test_kill_9_mid_stream_leaves_an_interrupted_record(tmp_path):
    settings, tokens = gw.provision(tmp_path)
    headers = {"Authorization": f"Bearer {tokens['acme']}"}
    port = _free_port()
    server = _serve(tmp_path, settings, port)
    received_ids: list[int] = []
    received_text: list[str] = []
    received_counts: list[int] = []  # tokens per delta
    generation_id = None
    killed_after = None
    try:
        # The model may end a text early (each run draws a fresh key): stream again until one
        # reaches 100 tokens, then kill the server under it.
        for _ in range(8):
            received_ids, received_text, received_counts, generation_id = [], [], [], None
            with httpx.Client(timeout=60) as client:
                with client.stream("POST", f"http://127.0.0.1:{port}/v1/generate", headers=headers,
                                   json={"prompt": "Once upon a time", "max_tokens": 1024, "stream": True,
                                         "temperature": 1.0, "stop": []}) as response:
                    try:
                        for line in response.iter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            event = json.loads(line[6:])
                            generation_id = event.get("generation_id", generation_id)
                            if event["type"] == "delta":
                                received_ids.extend(event["token_ids"])
                                received_text.append(event["text"])
                                received_counts.append(len(event["token_ids"]))
                            if killed_after is None and len(received_ids) >= 100:
                                killed_after = len(received_ids)
                                os.kill(server.pid, signal.SIGKILL)  # no handler runs, no finally block
                            if event["type"] in ("done", "error"):
                                break
                    except (httpx.HTTPError, httpx.StreamError):
                        pass  # the connection died with the server; what arrived before counts
            if killed_after is not None:
                break
    finally:
        server.kill()
        server.wait(30)
    assert killed_after is not None and generation_id is not None, "the stream ended before the kill"
    sent = len(received_ids)  # everything the server wrote arrives before the connection closes
    assert sent < 1024, "the generation finished before the kill"

    port = _free_port()
    server = _serve(tmp_path, settings, port)  # the restart closes what the dead process left open
    try:
        record = httpx.get(f"http://127.0.0.1:{port}/v1/generations/{generation_id}", headers=headers,
                           timeout=30).json()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    assert record["status"] == "interrupted" and record["finish_reason"] == "interrupted", record
    covered = record["output_tokens"]
    assert sent - CHECKPOINT_TOKENS <= covered <= sent, (covered, sent)
    # The record commits to exactly the first `covered` tokens the client received.
    assert record["token_ids_sha256"] == hash_token_ids(received_ids[:covered])
    # Checkpoints cover whole deltas (a delta may hold several tokens when the event loop is
    # busy: service/engines/local/outbox.py), so the text prefix is the text of the deltas
    # that hold the first `covered` tokens.
    deltas = next(i for i in range(len(received_counts) + 1) if sum(received_counts[:i]) >= covered)
    assert sum(received_counts[:deltas]) == covered
    assert record["output_sha256"] == hash_output("".join(received_text[:deltas]))
