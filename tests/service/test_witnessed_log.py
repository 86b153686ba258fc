"""Witnessed checkpoints (service.witnessing) against witnesses written from the C2SP texts
alone (tests/service/c2sp_witness.py): the gateway publishes a checkpoint only once its
tlog-policy quorum cosigned it, recovers from a witness's 409, and keeps publishing nothing
(while generating as before) when witnesses are down, slow, answer 409 forever, return a
bad cosignature or hold another history (a fork)."""

from __future__ import annotations

import hashlib
import time

import httpx
import pytest

from tests.keys.conftest import Cli
from tests.service import gateway
from tests.service.c2sp_witness import Witness, verify_cosignature


def _generate(running, seed: int) -> dict:
    response = httpx.post(running.url + "/v1/generate", timeout=300,
                          json={"prompt": "The function returns", "max_tokens": 4, "seed": seed},
                          headers={"Authorization": f"Bearer {running.tokens['acme']}"})
    assert response.status_code == 200, response.text
    return response.json()


def _checkpoint(running) -> str:
    return httpx.get(running.url + "/v1/ledger/log/checkpoint").text


@pytest.fixture
def cli(monkeypatch, capsys):
    return Cli(monkeypatch, capsys)


@pytest.fixture
def world(tmp_path):
    """A gateway whose policy needs both of two witnesses (Ed25519 and ML-DSA-44), or either
    (group `any`) where a test swaps the quorum, with short timeouts."""
    witnesses = [Witness("w1.example/ed", "ed25519").start(), Witness("w2.example/pq", "ml-dsa-44").start()]
    policy = tmp_path / "policy.txt"

    def write(quorum: str) -> None:
        policy.write_text("".join(f"witness {w.name} {w.vkey} {w.url}\n" for w in witnesses)
                          + "group both all w1.example/ed w2.example/pq\ngroup either any w1.example/ed w2.example/pq\n"
                          + f"quorum {quorum}\n")

    write("both")
    # The witnesses must trust the log before the gateway's first round: its key is made on start,
    # so the first round fails (404), and the tests publish after trusting it.
    running = gateway.start(tmp_path, witness_policy=str(policy), witness_timeout_seconds=0.5, witness_attempts=2)
    vkey = running.app.state.services.log_authority().verifier.vkey
    for w in witnesses:
        w.trust(vkey)
    try:
        yield running, witnesses, write
    finally:
        running.stop()
        for w in witnesses:
            w.stop()


def test_a_checkpoint_is_published_once_the_quorum_cosigned(world):
    running, (ed, pq), _ = world
    services = running.app.state.services
    _generate(running, 1)
    size = services.publish_checkpoint()
    assert size is not None and size > 0
    note = _checkpoint(running)
    assert note.split("\n")[1] == str(size)
    assert verify_cosignature(ed.vkey, note) and verify_cosignature(pq.vkey, note)
    origin = note.split("\n")[0]
    assert ed.state[origin][0] == pq.state[origin][0] == size
    # A witness that lost its state (or another log replica's view of it): 409 with its size,
    # then the proof from that size.
    services.witnessing.sizes.clear()
    _generate(running, 2)
    assert services.publish_checkpoint() > size
    assert ed.state[origin][0] == pq.state[origin][0] > size
    # The entry bound hands the round to the publisher thread: the generation's answer does not
    # wait for it, and the cosigned checkpoint follows.
    services.settings = services.settings.model_copy(update={"checkpoint_every_entries": 1})
    out = _generate(running, 3)
    deadline = time.monotonic() + 60
    while int(_checkpoint(running).split("\n")[1]) <= out["receipt"]["log"]["leaf_index"]:
        assert time.monotonic() < deadline, "the publisher thread published no cosigned checkpoint"
        time.sleep(0.05)
    assert verify_cosignature(pq.vkey, _checkpoint(running))


def test_receipts_verify_offline_under_a_witness_policy(world, tmp_path, cli):
    """A receipt fetched again once a cosigned checkpoint covers it carries a tlog-proof
    that `hallmark receipt verify --policy` checks offline (log signature, the quorum, with
    an ML-DSA-44 cosignature among it, inclusion); the receipt as first issued (its
    checkpoint not yet witnessed) and a policy asking for a witness that did not cosign fail."""
    import json

    running, (ed, pq), _ = world
    out = _generate(running, 3)
    assert out["receipt"]["log"]["tlog_proof"].startswith("c2sp.org/tlog-proof@v1\n")
    running.app.state.services.publish_checkpoint()
    again = httpx.get(f"{running.url}/v1/generations/{out['generation_id']}/receipt",
                      headers={"Authorization": f"Bearer {running.tokens['acme']}"}).json()
    keyset = httpx.get(running.url + "/.well-known/hallmark-keys.json").json()
    (tmp_path / "keys.json").write_text(json.dumps(keyset))
    policy = tmp_path / "verify.policy"
    lines = f"log {keyset['log']['vkey']}\nwitness A {ed.vkey}\nwitness B {pq.vkey}\n"
    policy.write_text(lines + "group AB all A B\nquorum AB\n")
    for name, document in (("again", again), ("first", out["receipt"])):
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    ok = cli.ok("receipt", "verify", str(tmp_path / "again.json"), "--keys", str(tmp_path / "keys.json"), "--policy",
                str(policy), "--json").json()
    assert ok["witnessed"]["cosigned_by"] == ["A", "B"] and ok["witnessed"]["tree_size"] >= again["log"]["tree_size"]
    first = cli.fails("receipt", "verify", str(tmp_path / "first.json"), "--keys", str(tmp_path / "keys.json"),
                      "--policy", str(policy))
    assert "lacks the policy's witness quorum" in first.stderr
    stranger = Witness("w3.example/ed", "ed25519")
    policy.write_text(lines + f"witness C {stranger.vkey}\ngroup ABC all A B C\nquorum ABC\n")
    short = cli.fails("receipt", "verify", str(tmp_path / "again.json"), "--keys", str(tmp_path / "keys.json"),
                      "--policy", str(policy))
    assert "lacks the policy's witness quorum" in short.stderr and "good cosignatures from: A, B" in short.stderr
    # A detection report citing the generation (an exact copy) carries the entry's tlog-proof,
    # against the cosigned checkpoint: `report verify --policy` checks it offline.
    policy.write_text(lines + "group AB all A B\nquorum AB\n")
    detected = httpx.post(running.url + "/v1/detect", json={"text": out["text"]}, timeout=300,
                          headers={"Authorization": f"Bearer {running.tokens['acme']}"}).json()
    assert detected["ledger_matches"] and len(detected["report"]["log"]["tlog_proofs"]) == 1
    (tmp_path / "report.json").write_text(json.dumps(detected))
    proved = cli.ok("report", "verify", str(tmp_path / "report.json"), "--keys", str(tmp_path / "keys.json"),
                    "--policy", str(policy), "--json").json()["proved"]
    assert proved[out["generation_id"]]["cosigned_by"] == ["A", "B"]
    tampered = json.loads(json.dumps(detected))
    tampered["report"]["log"]["tlog_proofs"] = []
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    refused = cli.fails("report", "verify", str(tmp_path / "tampered.json"), "--keys", str(tmp_path / "keys.json"),
                        "--policy", str(policy))
    assert "no tlog-proof for the cited entry" in refused.stderr


@pytest.mark.parametrize("fault", ["down", "slow", "conflict", "ahead", "bad-signature", "fork"])
def test_a_faulty_witness_withholds_publication_not_generation(world, fault):
    running, (ed, pq), write = world
    services = running.app.state.services
    _generate(running, 1)
    published = services.publish_checkpoint()
    assert published is not None
    origin = _checkpoint(running).split("\n")[0]
    if fault == "down":
        pq.stop()
    elif fault == "slow":
        pq.delay = 1.0
    elif fault == "fork":  # the witness saw another history at the size it cosigned
        pq.state[origin] = (published, hashlib.sha256(b"another history").digest())
    else:
        pq.mode = fault
    before = pq.requests
    _generate(running, 2)
    assert services.publish_checkpoint() is None
    assert _checkpoint(running).split("\n")[1] == str(published)  # still the last cosigned one
    if fault in ("conflict", "ahead"):
        # 409 forever: the attempts, then the round gives up; a size above the log's: at once.
        assert pq.requests - before == (2 if fault == "conflict" else 1)
    # Either witness is enough under another quorum: published with the honest one's cosignature.
    write("either")
    from service.state import witnessing_of
    services.witnessing = witnessing_of(services.settings)
    services.witnessing.sizes[ed.name] = published
    size = services.publish_checkpoint()
    assert size is not None and size > published
    note = _checkpoint(running)
    assert verify_cosignature(ed.vkey, note) and not verify_cosignature(pq.vkey, note)
    pq.delay = 0


def test_hallmark_witness_serve_witnesses_a_gateway(tmp_path):
    """`hallmark witness serve` (ML-DSA-44) as one of the gateway's two witnesses, over HTTP,
    in its own process; its cosignature verifies in the independent implementation, and its
    monitoring endpoint serves the cosigned checkpoint."""
    import os
    import socket
    import subprocess
    import sys
    import time

    directory = tmp_path / "witness"
    key = subprocess.run([sys.executable, "-m", "service.cli", "witness", "key", "--dir", str(directory), "--name",
                          "hallmark-witness.example", "--alg", "ml-dsa-44"], capture_output=True, text=True, timeout=120)
    assert key.returncode == 0, key.stderr
    vkey = key.stdout.strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    other = Witness("w1.example/ed", "ed25519").start()
    policy = tmp_path / "policy.txt"
    policy.write_text(f"witness ours {vkey} http://127.0.0.1:{port}\nwitness theirs {other.vkey} {other.url}\n"
                      "group both all ours theirs\nquorum both\n")
    running = gateway.start(tmp_path, witness_policy=str(policy), witness_timeout_seconds=2.0, witness_attempts=2)
    serving = None
    try:
        log_vkey = running.app.state.services.log_authority().verifier.vkey
        other.trust(log_vkey)
        serving = subprocess.Popen([sys.executable, "-m", "service.cli", "witness", "serve", "--dir", str(directory),
                                    "--log", log_vkey, "--port", str(port)], stderr=subprocess.PIPE, text=True,
                                   env={**os.environ})
        deadline = time.time() + 120
        while True:  # ready when it answers (any status)
            try:
                httpx.get(f"http://127.0.0.1:{port}/{'0' * 64}/checkpoint")
                break
            except httpx.HTTPError:
                assert time.time() < deadline and serving.poll() is None, "hallmark witness serve did not start"
                time.sleep(0.2)
        _generate(running, 1)
        size = running.app.state.services.publish_checkpoint()
        assert size is not None
        note = _checkpoint(running)
        assert verify_cosignature(vkey, note) and verify_cosignature(other.vkey, note)
        origin = note.split("\n")[0]
        monitored = httpx.get(f"http://127.0.0.1:{port}/{hashlib.sha256(origin.encode()).hexdigest()}/checkpoint")
        assert monitored.status_code == 200 and monitored.text.split("\n")[1] == str(size)
        assert verify_cosignature(vkey, monitored.text)
    finally:
        if serving is not None:
            serving.terminate()
            serving.wait(30)
        running.stop()
        other.stop()
