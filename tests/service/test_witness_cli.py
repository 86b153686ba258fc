"""`hallmark ledger witness`, `ledger checkpoint` and the https rule of verifying commands:
the first run stores, later runs extend only through a verified consistency proof, and a
rollback, a fork, a bad signature or a failed proof exits 1 with one line and keeps the
state. Against a running gateway (--url); tests/ledger/log/test_witness.py has the database's
rollbacks, forks, failed proofs and split views."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.log.note import NoteSigner
from tests.keys.conftest import Cli
from tests.service import gateway
from tests.service.test_tamper_matrix import _generate


@pytest.fixture
def cli(monkeypatch, capsys):
    return Cli(monkeypatch, capsys)


def test_witness_against_a_running_gateway(tmp_path, cli):
    running = gateway.start(tmp_path)
    state = tmp_path / "w" / "state.json"
    try:
        first = cli("ledger", "witness", "--state", str(state), "--url", running.url, "--json")
        assert first.exit_code == 0, first.stderr
        body = first.json()
        assert body["first_run"] and body["log_key"] and oct(state.stat().st_mode & 0o777) == "0o600"
        _generate(running.url, running.tokens["acme"], "The function returns", 3)
        running.app.state.services.publish_checkpoint()
        again = cli.ok("ledger", "witness", "--state", str(state), "--url", running.url, "--json").json()
        assert again["size"] > body["size"] and again["previous_size"] == body["size"]
        # The same log under another pinned key: a bad signature, one line, state kept.
        other = tmp_path / "other.json"
        forged = json.loads(state.read_text())
        forged["log_key"] = NoteSigner(forged["origin"], Ed25519PrivateKey.generate()).verifier.vkey
        signer = NoteSigner(forged["origin"], Ed25519PrivateKey.generate())
        forged["log_key"] = signer.verifier.vkey
        forged["checkpoint"] = signer.sign(forged["checkpoint"].split("\n\n")[0] + "\n")
        other.write_text(json.dumps(forged))
        kept = other.read_text()
        refused = cli.fails("ledger", "witness", "--state", str(other), "--url", running.url)
        assert "no signature by the log key" in refused.stderr and other.read_text() == kept
        # Plain http only to this machine; https elsewhere.
        for url in ("http://gateway.example", "ftp://127.0.0.1"):
            assert "https://" in cli.fails("ledger", "witness", "--state", str(tmp_path / "x.json"), "--url",
                                           url).stderr
            assert "https://" in cli.fails("receipt", "verify", str(state), "--url", url, "--trust-log-key",
                                           str(state)).stderr
    finally:
        running.stop()


def _fresh_cli(*args: str, cwd) -> "subprocess.CompletedProcess":
    """`hallmark` in a fresh process with no database and no KEK configured."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("HALLMARK_")}
    env["HALLMARK_DATABASE_URL"] = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # unreachable on purpose
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_receipts_verify_offline_with_their_log_proof(tmp_path):
    """A receipt (JSON and streamed) carries its leaf index, a checkpoint and the inclusion
    proof: `receipt verify` checks them in a fresh process with only the key set and the
    pinned log key; a moved leaf, a broken proof, a checkpoint from another log or another
    text are each refused with one line."""
    import copy

    running = gateway.start(tmp_path)
    try:
        plain = _generate(running.url, running.tokens["acme"], "The function returns", 21)
        streamed = _generate(running.url, running.tokens["globex"], "Return a new list", 22, stream=True)
        keyset = __import__("httpx").get(running.url + "/.well-known/hallmark-keys.json").json()
    finally:
        running.stop()
    (tmp_path / "keys.json").write_text(json.dumps(keyset))
    (tmp_path / "log.vkey").write_text(keyset["log"]["vkey"] + "\n")
    base = ["--keys", str(tmp_path / "keys.json"), "--trust-log-key", str(tmp_path / "log.vkey")]
    for name, response in (("plain", plain), ("stream", streamed)):
        assert response["receipt"]["statement"]["version"] == 2
        assert response["receipt"]["log"]["leaf_index"] == response["receipt"]["statement"]["ledger"]["leaf_index"]
        (tmp_path / f"{name}.json").write_text(json.dumps(response))
        (tmp_path / f"{name}.txt").write_text(response["text"])
        ok = _fresh_cli("receipt", "verify", str(tmp_path / f"{name}.json"), "--text", str(tmp_path / f"{name}.txt"),
                        *base, cwd=tmp_path)
        assert ok.returncode == 0 and "in the log" in ok.stdout and "the text matches" in ok.stdout, ok.stderr
    receipt = plain["receipt"]
    other_log = NoteSigner(keyset["log"]["origin"], Ed25519PrivateKey.generate())
    bad_proof = copy.deepcopy(receipt)
    bad_proof["log"]["inclusion_proof"] = [h[:-4] + "AAA=" for h in receipt["log"]["inclusion_proof"]] or ["A" * 43 + "="]
    moved = copy.deepcopy(receipt)
    moved["log"]["leaf_index"] += 1
    foreign = copy.deepcopy(receipt)
    foreign["log"]["checkpoint"] = other_log.sign(receipt["log"]["checkpoint"].split("\n\n")[0] + "\n")
    unlogged = copy.deepcopy(receipt)
    unlogged.pop("log")
    (tmp_path / "other.txt").write_text(plain["text"] + " (edited)")
    for document, extra, reason in [
        (bad_proof, [], "not in the log"),
        (moved, [], "malformed"),
        (foreign, [], "no signature by the log key"),
        (unlogged, [], "no transparency-log proof"),
        (receipt, ["--text", str(tmp_path / "other.txt")], "the text does not match"),
    ]:
        path = tmp_path / "tampered.json"
        path.write_text(json.dumps(document))
        refused = _fresh_cli("receipt", "verify", str(path), *base, *extra, cwd=tmp_path)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 1 and len(lines) == 1 and reason in lines[0], (reason, refused.stderr)
    (tmp_path / "other.vkey").write_text(other_log.verifier.vkey + "\n")
    pinned_elsewhere = _fresh_cli("receipt", "verify", str(tmp_path / "plain.json"), "--keys", str(tmp_path / "keys.json"),
                                  "--trust-log-key", str(tmp_path / "other.vkey"), cwd=tmp_path)
    assert pinned_elsewhere.returncode == 1 and "key set rejected" in pinned_elsewhere.stderr


def test_checkpoints_are_published_every_n_entries_and_t_seconds(tmp_path):
    """At least every HALLMARK_CHECKPOINT_EVERY_ENTRIES entries (here 3) and
    HALLMARK_CHECKPOINT_EVERY_SECONDS seconds (here 2) after an entry is logged."""
    import time

    import httpx

    from ledger.log.note import Checkpoint

    def published() -> int:
        note = httpx.get(running.url + "/v1/ledger/checkpoint").text
        return Checkpoint.parse_text(note.split("\n\n")[0] + "\n").size

    running = gateway.start(tmp_path, checkpoint_every_entries=3, checkpoint_every_seconds=2.0)
    try:
        start = published()  # the gateway publishes at start
        for seed in range(3):
            _generate(running.url, running.tokens["acme"], "The function returns", seed)
        assert published() >= start + 3  # the entry bound, without waiting
        _generate(running.url, running.tokens["acme"], "Return a new list", 9)
        size = published()
        deadline = time.monotonic() + 20
        while published() == size and time.monotonic() < deadline:
            time.sleep(0.2)
        assert published() == size + 1  # the time bound
    finally:
        running.stop()
