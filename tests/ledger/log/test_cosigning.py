"""Cosignatures (ledger.log.cosignature), tlog-policy (ledger.log.policy) and the witness of
`hallmark witness serve` (ledger.log.cosigning_witness), each checked against the
independent implementation written from the C2SP texts (tests/service/c2sp_witness.py)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.log import merkle
from ledger.log.cosignature import CosignerKey, cosigned_by, from_seed, generate, private_seed
from ledger.log.cosigning_witness import CosigningWitness
from ledger.log.note import Checkpoint, NoteError, NoteSigner
from ledger.log.policy import PolicyError, parse
from ledger.log.witness_protocol import request_body
from tests.service import c2sp_witness

ORIGIN = "log.example/hallmark"


def _tree(n: int) -> list[bytes]:
    return [merkle.leaf_hash(b"leaf %d" % i) for i in range(n)]


def _root(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return leaves[0]
    k = merkle.split(len(leaves))
    return merkle.node_hash(_root(leaves[:k]), _root(leaves[k:]))


def _proof(leaves: list[bytes], old: int, new: int) -> list[bytes]:
    found: dict = {}
    for level in range(0, 8):
        for index in range(new >> level):
            found[level, index] = _root(leaves[index << level:(index + 1) << level])
    return merkle.range_hashes(merkle.consistency_ranges(old, new), lambda lv, ix: found[lv, ix])


@pytest.fixture
def log_signer():
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


def _checkpoint(signer, leaves, size):
    root = _root(leaves[:size]) if size else merkle.EMPTY_ROOT
    return signer.sign(Checkpoint(ORIGIN, size, root, 1).text())


@pytest.mark.parametrize("algorithm", ["ed25519", "ml-dsa-44"])
def test_cosignatures_verify_in_both_implementations(log_signer, algorithm):
    leaves = _tree(5)
    note = _checkpoint(log_signer, leaves, 5)
    text = note.split("\n\n")[0] + "\n"
    cosigner = generate("witness.example/w1", algorithm)
    again = from_seed("witness.example/w1", *private_seed(cosigner))
    assert again.key == cosigner.key and CosignerKey.parse(cosigner.key.vkey) == cosigner.key
    cosigned = note + cosigner.cosign(text, 1_700_000_000)
    assert cosigned_by(cosigned, [cosigner.key]) == {cosigner.key: 1_700_000_000}
    assert c2sp_witness.verify_cosignature(cosigner.key.vkey, cosigned) == 1_700_000_000
    # The independent witness's cosignature verifies here.
    other = c2sp_witness.Witness("witness.example/w2", algorithm)
    other.trust(log_signer.verifier.vkey)
    status, _, line = other.add_checkpoint(request_body(0, [], note))
    assert status == 200
    key = CosignerKey.parse(other.vkey)
    assert key in cosigned_by(note + line.decode(), [key])
    # Altered checkpoint: not a cosignature of it; another key's line is ignored.
    assert cosigned_by(cosigned.replace("\n5\n", "\n6\n"), [cosigner.key]) == {}
    assert cosigned_by(cosigned, [key]) == {}


def test_policies_parse_and_quorums(log_signer):
    w = [generate(f"w{i}.example", "ed25519").key for i in range(4)]
    policy = parse(f"""# two groups
log {log_signer.verifier.vkey} https://log.example
witness A {w[0].vkey} http://127.0.0.1:1
witness B {w[1].vkey}
  witness C\t{w[2].vkey}
group AB 2 A B
group ABC any AB C
quorum ABC
""")
    assert policy.witnessed and policy.witnesses["A"].url == "http://127.0.0.1:1"
    assert policy.satisfied({"A", "B"}) and policy.satisfied({"C"}) and not policy.satisfied({"A"})
    assert parse("quorum none\n").satisfied(set())
    for bad, reason in [("", "exactly one quorum"), ("quorum X\n", "not a witness or group"),
                        (f"witness A {w[0].vkey}\nwitness A {w[1].vkey}\nquorum A\n", "defined twice"),
                        (f"witness A {w[0].vkey}\nwitness B {w[0].vkey}\nquorum A\n", "listed twice"),
                        (f"witness A {w[0].vkey}\ngroup G 2 A\nquorum G\n", "threshold"),
                        (f"witness A {w[0].vkey}\ngroup G all A A\nquorum G\n", "twice"),
                        (f"witness A {log_signer.verifier.vkey}\nquorum A\n", "cosignature key"),
                        ("frobnicate\nquorum none\n", "unknown keyword")]:
        with pytest.raises(PolicyError, match=reason):
            parse(bad)


def test_the_witness_answers_as_the_spec_says(tmp_path, log_signer):
    leaves = _tree(12)
    witness = CosigningWitness(tmp_path / "w.db", generate("witness.example/w", "ml-dsa-44"))
    note4 = _checkpoint(log_signer, leaves, 4)
    assert witness.add_checkpoint(request_body(0, [], note4)).status == 404  # origin unknown
    witness.add_log(log_signer.verifier.vkey)
    stranger = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    assert witness.add_checkpoint(request_body(0, [], _checkpoint(stranger, leaves, 4))).status == 403
    forged = note4.replace("\n4\n", "\n5\n")
    assert witness.add_checkpoint(request_body(0, [], forged)).status == 403
    assert witness.add_checkpoint(b"old 01\n\n" + note4.encode()).status == 400
    assert witness.add_checkpoint(request_body(5, [], note4)).status == 400  # old above size
    first = witness.add_checkpoint(request_body(0, [], note4))
    assert first.status == 200
    assert c2sp_witness.verify_cosignature(witness.cosigner.key.vkey, note4 + first.body.decode())
    note9 = _checkpoint(log_signer, leaves, 9)
    conflict = witness.add_checkpoint(request_body(0, [], note9))
    assert (conflict.status, conflict.body, conflict.content_type) == (409, b"4\n", "text/x.tlog.size")
    assert witness.add_checkpoint(request_body(4, [hashlib.sha256(b"x").digest()], note9)).status == 422
    assert witness.add_checkpoint(request_body(4, _proof(leaves, 4, 9), note9)).status == 200
    # A fork at a size it cosigned, and a fork beyond it: 422, its state kept.
    other = _tree(12)
    other[2] = merkle.leaf_hash(b"rewritten")
    assert witness.add_checkpoint(request_body(9, [], _checkpoint(log_signer, other, 9))).status == 422
    assert witness.add_checkpoint(request_body(9, _proof(other, 9, 12),
                                               _checkpoint(log_signer, other, 12))).status == 422
    monitored = witness.checkpoint(hashlib.sha256(ORIGIN.encode()).hexdigest())
    assert monitored.status == 200 and monitored.body.decode().split("\n")[1] == "9"
    assert witness.checkpoint("0" * 64).status == 404
    with pytest.raises(NoteError):
        witness.add_log("not a key")
    assert base64.b64decode(witness.cosigner.key.vkey.split("+", 2)[2])[0] == 0x06
