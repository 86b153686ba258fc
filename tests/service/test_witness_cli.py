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


def test_receipts_and_reports_verify_with_a_log_key_pinned_on_first_use(tmp_path, cli, monkeypatch):
    """Issue 34, item 6: `hallmark receipt verify` needed --trust-log-key and no "Try it" step
    made that file; given a detection report it did not point to `report verify`. Now
    `hallmark ledger pin --url` pins the gateway's log key once (trust on first use, said so),
    both verifying commands use the pin, a log that offers another key under the pinned name
    is refused, and each command given the other's document names the right one."""
    import httpx

    known = tmp_path / "config" / "known-logs"
    monkeypatch.setenv("HALLMARK_KNOWN_LOGS", str(known))
    running = gateway.start(tmp_path)
    try:
        out = _generate(running.url, running.tokens["acme"], "The function returns", 5)
        detected = httpx.post(running.url + "/v1/detect", json={"text": out["text"]}, timeout=300,
                              headers={"Authorization": f"Bearer {running.tokens['acme']}"}).json()
        (tmp_path / "out.json").write_text(json.dumps(out))
        (tmp_path / "detect.json").write_text(json.dumps(detected))
        receipt = ("receipt", "verify", str(tmp_path / "out.json"), "--url", running.url)
        report = ("report", "verify", str(tmp_path / "detect.json"), "--url", running.url)
        refused = cli.fails(*receipt).stderr
        assert f"pin it once with `hallmark ledger pin --url {running.url}`" in refused and "--trust-log-key" in refused
        assert not known.exists()
        pinned = cli.ok("ledger", "pin", "--url", running.url).stdout
        log_key = httpx.get(running.url + "/.well-known/hallmark-keys.json").json()["log"]["vkey"]
        assert pinned.startswith("pinned on first use") and log_key in pinned and "compare it with" in pinned
        assert known.read_text() == log_key + "\n" and oct(known.stat().st_mode & 0o777) == "0o600"
        assert cli.ok("ledger", "pin", "--url", running.url, "--json").json()["pinned_now"] is False
        assert known.read_text() == log_key + "\n"
        assert cli.ok(*receipt).stdout.startswith(f"ok: receipt of generation {out['generation_id']}")
        assert cli.ok(*report).stdout.startswith("ok: detection report of ")
        # Each command given the other's document says which one checks it.
        wrong = cli.fails("receipt", "verify", str(tmp_path / "detect.json"), "--url", running.url).stderr
        assert "holds a detection report, not a generation receipt" in wrong and "`hallmark report verify " in wrong
        wrong = cli.fails("report", "verify", str(tmp_path / "out.json"), "--url", running.url).stderr
        assert "holds a generation receipt, not a detection report" in wrong and "`hallmark receipt verify " in wrong
        # Another key under the pinned log's name: pinning refuses it, verifying rejects the key set.
        origin = log_key.split("+", 1)[0]
        known.write_text(NoteSigner(origin, Ed25519PrivateKey.generate()).verifier.vkey + "\n")
        assert "now offers another key than the one pinned" in cli.fails("ledger", "pin", "--url", running.url).stderr
        assert "key set rejected" in cli.fails(*receipt).stderr
    finally:
        running.stop()


def _published(url: str) -> int:
    """The size of the log's latest published checkpoint."""
    import httpx

    from ledger.log.note import Checkpoint

    note = httpx.get(url + "/v1/ledger/checkpoint").text
    return Checkpoint.parse_text(note.split("\n\n")[0] + "\n").size


def _logged(running, prompt: str, seed: int) -> int:
    """Generate; the log size the generation's entry made (its receipt's ``tree_size``)."""
    return _generate(running.url, running.tokens["acme"], prompt, seed)["receipt"]["log"]["tree_size"]


def test_checkpoints_are_published_every_n_entries_and_t_seconds(tmp_path):
    """At least every HALLMARK_CHECKPOINT_EVERY_ENTRIES entries (here 3) and
    HALLMARK_CHECKPOINT_EVERY_SECONDS seconds (here 2) after an entry is logged.

    Issue 34, item 11: this read the checkpoint right after three generations and expected it
    to hold all three (`3 >= 1 + 3` in a loaded run). Under load a generation takes over 2 s,
    so the time bound publishes between them and the entry bound, counted from the last
    publication, has nothing to do yet: both bounds held. What the bounds promise is checked
    instead: when a generation's response leaves, fewer than 3 of the log's entries are
    unpublished; and the time bound's publication is waited for (with a deadline), never
    assumed after a fixed delay. The entry bound alone: the next test."""
    import time

    running = gateway.start(tmp_path, checkpoint_every_entries=3, checkpoint_every_seconds=2.0)
    try:
        for seed in range(4):
            size = _logged(running, "The function returns", seed)
            assert _published(running.url) > size - 3, seed  # the entry bound, without waiting
        deadline = time.monotonic() + 20
        while _published(running.url) < size and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _published(running.url) == size  # the time bound
    finally:
        running.stop()


def test_the_entry_bound_publishes_every_n_entries_even_while_another_publication_runs(tmp_path):
    """With the time bound out of the way (an hour), the Nth entry after a publication is
    published before its response leaves, and not one earlier. And the race behind item 11,
    made to happen: while another publication holds the lock (the background round's; a
    stand-in lock that refuses every non-blocking acquire), the entry bound used to return
    without publishing, so entries piled up unpublished; it now waits for that publication and
    publishes the log as its append left it."""
    import threading

    running = gateway.start(tmp_path, checkpoint_every_entries=3, checkpoint_every_seconds=3600)
    services = running.app.state.services
    try:
        start = _published(running.url)
        sizes = [_logged(running, "The function returns", seed) for seed in range(2)]
        assert _published(running.url) == start and sizes == [start + 1, start + 2]
        third = _logged(running, "The function returns", 2)
        assert third == start + 3 and _published(running.url) == third
        lock, waited = services._publish_lock, threading.Event()

        class Busy:
            def acquire(self, blocking=True):
                if not blocking:
                    return False
                waited.set()
                return lock.acquire()

            def release(self):
                lock.release()

        services._publish_lock = Busy()
        try:
            sizes = [_logged(running, "Return a new list", seed) for seed in range(3)]
        finally:
            services._publish_lock = lock
        assert waited.is_set() and sizes[-1] == start + 6 and _published(running.url) == start + 6
    finally:
        running.stop()
