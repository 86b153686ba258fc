"""The transparency log in the store (ledger.log.tlog, ledger.log.note, ledger.log.leaves): appends sequenced
with their entries, proofs that verify against signed checkpoints, MACs that refuse what was
written without the log key, adoption of a store's existing entries, and what detection may
cite. Both databases."""

from __future__ import annotations

import base64
import hashlib
import struct

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, select, text

from keys.errors import LedgerImmutable
from keys.models import LedgerEntry, LogHead, LogLeaf
from ledger.entries import find_generations_by_output_hash, hash_output, record_generation
from ledger.kgrams import kgram_set
from ledger.log import merkle, tlog
from ledger.log.key import LogKeyError, forget_log_key
from ledger.log.leaves import EMPTY_KGRAMS, entry_leaf, kgram_commitment
from ledger.log.note import Checkpoint, NoteError, NoteSigner, Verifier, open_checkpoint, open_note
from tests.keys.conftest import assert_refused


def _record(store, tenant_id, text_: str, key=None, tokens=None):
    tokens = tokens or [1, 2, 3]
    with store.transaction() as session:
        return record_generation(
            session, tenant_id=tenant_id, key_id=key.key_id if key else None, key_version=key.version if key else None,
            engine="local", model="tiny", spec=key.spec if key else None, prompt_tokens=1,
            watermarked_tokens=len(tokens) if key else 0, unwatermarked_reason=None if key else "opt_out",
            output_text=text_, token_ids=tokens,
            kgram_set=kgram_set(key.key_id, key.material.secret, tokens) if key else None)


# --- signed notes --------------------------------------------------------------------------


def test_signed_notes_and_checkpoints():
    signer = NoteSigner("example.com/log", Ed25519PrivateKey.generate())
    checkpoint = Checkpoint("example.com/log", 7, hashlib.sha256(b"root").digest(), 123)
    note = signer.sign(checkpoint.text())
    assert note.startswith("example.com/log\n7\n") and "\n\n\u2014 example.com/log " in note
    assert open_checkpoint(note, signer.verifier) == checkpoint
    # The verifier key round-trips, also when its base64 holds '+' (names may not).
    for _ in range(20):
        other = NoteSigner("example.com/log", Ed25519PrivateKey.generate()).verifier
        assert Verifier.parse(other.vkey) == other
    with pytest.raises(NoteError, match="bad signature"):
        open_checkpoint(note.replace("\n7\n", "\n8\n"), signer.verifier)
    stranger = NoteSigner("example.com/log", Ed25519PrivateKey.generate())
    with pytest.raises(NoteError, match="no signature by the log key"):
        open_checkpoint(stranger.sign(checkpoint.text()), signer.verifier)
    # A cosignature by another key rides along and is ignored.
    cosigned = note + stranger.sign(checkpoint.text()).split("\n\n")[1].replace(
        "example.com/log", "witness.example/w1")
    assert open_note(cosigned, signer.verifier) == checkpoint.text()
    with pytest.raises(NoteError):
        Verifier.parse(signer.verifier.vkey.replace("+", "-", 1))


# --- the log in the store -----------------------------------------------------------------


def test_appends_are_sequenced_with_their_entries_and_prove(store, two_tenants):
    made = two_tenants(beta_key=True)
    records = [_record(store, made.acme.id, f"acme {i}", made.acme_key, tokens=list(range(i, i + 20)))
               for i in range(5)]
    records += [_record(store, made.beta.id, f"beta {i}") for i in range(4)]
    positions = [r.log.leaf_index for r in records]
    assert positions == sorted(positions) and len(set(positions)) == 9
    with store.transaction(write=False) as session:
        auth = tlog.required_authority(session)
        size, border = tlog.read_head(session, auth)
        root = merkle.root(border)
        assert tlog.root_at(session, size) == root
        for record in records:
            # The receipt's proof (free at append time) and one computed later both verify.
            leaf = merkle.leaf_hash(entry_leaf(record.entry_hash, record.kgrams_sha256))
            merkle.verify_inclusion(record.log.leaf_index, record.log.size, leaf, list(record.log.proof),
                                    record.log.root)
            merkle.verify_inclusion(record.log.leaf_index, size, leaf,
                                    tlog.inclusion_proof(session, record.log.leaf_index, size), root)
            merkle.verify_consistency(record.log.size, size, record.log.root, root,
                                      tlog.consistency_proof(session, record.log.size, size))
        note = tlog.signed_checkpoint(auth, size, root)
    assert open_checkpoint(note, auth.verifier).size == size
    with store.transaction(write=False) as session:
        scheme, digests = kgram_set(made.acme_key.key_id, made.acme_key.material.secret,
                                    list(range(0, 20))).digests(tlog.required_authority(session).kgram_key)
    assert scheme == 2 and records[0].kgrams_sha256 == kgram_commitment(digests, 2)
    assert records[-1].kgrams_sha256 == EMPTY_KGRAMS


def test_the_log_is_append_only_and_its_head_authenticates(store, two_tenants, database_url):
    made = two_tenants()
    _record(store, made.acme.id, "one")
    _record(store, made.acme.id, "one more")  # completes a subtree (a log_nodes row)
    with store.transaction() as session:
        tlog.publish(session, tlog.required_authority(session))
    with pytest.raises(LedgerImmutable):
        with store.transaction() as session:
            session.execute(select(LogLeaf)).scalars().first().kind = "signing_key"
            session.flush()
    assert_refused(database_url, ["UPDATE log_leaves SET kind = 'entry'", "DELETE FROM log_nodes",
                                  "DELETE FROM log_checkpoints"], "append-only")
    # Someone without the log key moves the head (say, to append a leaf of their own): the
    # gateway refuses to build on it, so no checkpoint is ever signed over their leaf.
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE log_head SET size = size + 1, border = :b"),
                           {"b": hashlib.sha256(b"x").digest() * 2})
    engine.dispose()
    with pytest.raises(tlog.LogTampered, match="authenticate"):
        _record(store, made.acme.id, "three")


def test_detection_cites_only_what_the_log_holds(store, two_tenants, database_url):
    made = two_tenants()
    real = _record(store, made.acme.id, "the real one")
    # A forged entry, well chained, inserted by someone who can write the table.
    with store.transaction(write=False) as session:
        row = session.scalar(select(LedgerEntry).where(LedgerEntry.generation_id == real.id))
        fields = {c.name: getattr(row, c.name) for c in LedgerEntry.__table__.columns if c.name != "id"}
    from ledger.chain import entry_fields, entry_hash

    forged = dict(fields, generation_id="f" * 32, seq=row.seq + 1, prev_hash=row.entry_hash,
                  output_sha256=hash_output("forged text"))
    forged["entry_hash"] = entry_hash(entry_fields(type("R", (), forged)))
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(LedgerEntry.__table__.insert().values(**forged))
    engine.dispose()
    with store.transaction(write=False) as session:
        assert find_generations_by_output_hash(session, output_sha256=hash_output("forged text"), tenant_id=None) == []
        assert [g.id for g in find_generations_by_output_hash(
            session, output_sha256=hash_output("the real one"), tenant_id=None)] == [real.id]


def test_a_store_without_a_log_adopts_its_entries_on_first_write(store, two_tenants, database_url):
    """A store upgraded from 0007 has entries and signing keys but no log: the first process
    holding the KEK that writes creates the key and adopts them, in order, as the first leaves."""
    made = two_tenants()
    _record(store, made.acme.id, "before")
    engine = create_engine(database_url)
    with engine.begin() as connection:  # back to how 0008 leaves an old store: no log at all
        if engine.dialect.name == "postgresql":
            connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
        else:
            for table in ("log_leaves", "log_nodes"):
                for verb in ("update", "delete"):
                    connection.exec_driver_sql(f"DROP TRIGGER {table}_no_{verb}")
        for table in ("log_leaves", "log_nodes", "log_checkpoints", "log_keys"):
            connection.exec_driver_sql(f"DELETE FROM {table}")
        connection.exec_driver_sql("UPDATE log_head SET size = 0, border = '', mac = NULL")
    engine.dispose()
    forget_log_key(store)
    from ledger.log.audit import audit_log

    with store.transaction(write=False) as session:
        assert any("ledger init" in p for p in audit_log(session, None).problems)
    later = _record(store, made.acme.id, "after")
    assert later.log.leaf_index == 1 and later.log.size == 2
    with store.transaction(write=False) as session:
        assert [r.entry_id for r in session.scalars(select(LogLeaf).order_by(LogLeaf.idx))] == \
            list(session.scalars(select(LedgerEntry.id).order_by(LedgerEntry.id)))


def test_a_deleted_log_key_is_not_silently_replaced(store, two_tenants, database_url):
    made = two_tenants()
    _record(store, made.acme.id, "one")
    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.exec_driver_sql("DELETE FROM log_keys")
    engine.dispose()
    forget_log_key(store)
    with pytest.raises(LogKeyError, match="was deleted"):
        _record(store, made.acme.id, "two")


def test_publishing_checkpoints(store, two_tenants):
    made = two_tenants()
    _record(store, made.acme.id, "one")
    with store.transaction() as session:
        auth = tlog.required_authority(session)
        first = tlog.publish(session, auth)
        assert first is not None and tlog.publish(session, auth) is None  # that size is published
    _record(store, made.acme.id, "two")
    with store.transaction() as session:
        second = tlog.publish(session, auth)
        assert tlog.latest_checkpoint(session).size == second.size == first.size + 1
        head = session.get(LogHead, 1)
        assert head.mac == auth.mac(b"head", struct.pack(">Q", head.size), head.border)
    for row in (first, second):
        opened = open_checkpoint(row.note, auth.verifier)
        assert opened.root == row.root and base64.b64encode(opened.root)


def test_kek_rotation_rewraps_the_log_key(store, two_tenants, database_url):
    from keys.db import open_store
    from keys.kek import Kek
    from keys.kek_rotation import kek_status, rotate_kek
    from ledger.sealed import KEK_DEPENDANTS
    from keys.settings import StoreSettings
    from pydantic import SecretStr

    made = two_tenants()
    _record(store, made.acme.id, "before")
    with store.transaction(write=False) as session:
        before = tlog.required_authority(session).verifier
    new = Kek.generate()
    with store.transaction() as session:
        rotation = rotate_kek(session, current=store.keyring, new=new, actor="test", dependants=KEK_DEPENDANTS)
    assert rotation.rewrapped >= 2  # acme's key and the log key
    reopened = open_store(StoreSettings(database_url=database_url, kek=SecretStr(new.to_base64())), require_kek=True)
    try:
        _record(reopened, made.acme.id, "after")
        with reopened.transaction(write=False) as session:
            assert tlog.required_authority(session).verifier == before  # the same log, another KEK
            assert kek_status(session, reopened.keyring, KEK_DEPENDANTS).to_dict()["log_key"] == {new.id: 1}
    finally:
        reopened.close()
