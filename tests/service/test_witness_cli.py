"""`hallmark ledger witness`, `ledger checkpoint` and the https rule of verifying commands:
the first run stores, later runs extend only through a verified consistency proof, and a
rollback, a fork, a bad signature or a failed proof exits 1 with one line and keeps the
state. Against a running gateway (--url); tests/keys/test_witness.py has the database's
rollbacks, forks, failed proofs and split views."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from keys.note import NoteSigner
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
