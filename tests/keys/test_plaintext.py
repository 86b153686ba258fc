"""No secret in plaintext anywhere it could leak: the SQLite file and its WAL, PostgreSQL
rows, audit rows, reprs, logs."""

from __future__ import annotations

import base64
import logging
import secrets
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import create_engine, text

from keys.audit import list_audit
from keys.db import Store, open_store
from keys.kek import Kek, Keyring
from keys.kek_rotation import rotate_kek
from ledger.sealed import KEK_DEPENDANTS
from ledger.entries import record_generation
from keys.lifecycle import create_key, import_key, list_keys, revoke_key, rotate_key
from keys.material import active_key, detection_keys, export_key
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from keys.tokens import issue_token
from tests.keys.conftest import APP_TABLES
from watermark.spec import WatermarkSpec

ACTOR = "test:grep"


def encodings(secret: int) -> list[bytes]:
    """Every way a secret (64- or 256-bit) is commonly written down."""
    size = 8 if secret < 2**64 else 32
    raw_be, raw_le = secret.to_bytes(size, "big"), secret.to_bytes(size, "little")
    forms = [str(secret), f"{secret:x}", f"{secret:X}", f"{secret:0{2 * size}x}", f"{secret:0{2 * size}X}",
             base64.b64encode(raw_be).decode()]
    if 2**63 <= secret < 2**64:
        forms.append(str(secret - 2**64))  # the int64 bit pattern torch holds
    return [form.encode() for form in forms] + [raw_be, raw_le]


def _populate(store: Store) -> tuple[list[int], list[str]]:
    """Fill a store with every kind of row; return the secrets and raw tokens it holds."""
    imported = secrets.randbits(64) | (1 << 63)
    with store.transaction() as session:
        acme = create_tenant(session, name="acme", actor=ACTOR)
        create_tenant(session, name="beta", actor=ACTOR)
        first = create_key(session, store.keyring, tenant="acme", actor=ACTOR)
        import_key(session, store.keyring, tenant="beta", secret=imported, spec=WatermarkSpec(),
                   source="vllm", actor=ACTOR)
        rotate_key(session, store.keyring, tenant="acme", actor=ACTOR,
                   spec_changes={"algorithm": "dual_key_gumbel"})
        revoke_key(session, key_id=first.key_id, reason="test", actor=ACTOR)
        export_key(session, store.keyring, key_id=first.key_id, actor=ACTOR)
        tokens = [issue_token(session, tenant="acme", actor=ACTOR).raw_token,
                  issue_token(session, tenant=None, admin=True, actor=ACTOR).raw_token]
    with store.transaction() as session:
        key = active_key(session, store.keyring, tenant_id=acme.id)
        record_generation(session, tenant_id=acme.id, key_id=key.key_id, key_version=key.version,
                          engine="local", model="tiny", spec=key.spec, prompt_tokens=3, output_tokens=5,
                          watermarked_tokens=5, unwatermarked_reason=None, output_text="hello")
    with store.transaction(write=False) as session:
        found = [k.material.secret for k in detection_keys(session, store.keyring)]
    assert imported in found and len(found) == 3
    return found, tokens


def _populated(settings: StoreSettings) -> tuple[list[int], list[str]]:
    store = open_store(settings, require_kek=True)
    try:
        return _populate(store)
    finally:
        store.close()


def _assert_absent(blob: bytes, secrets_: list[int], where: str) -> None:
    for secret in secrets_:
        for form in encodings(secret):
            assert form not in blob, f"a secret appears in {where} as {form!r}"


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.parent.glob(path.name + "*")}


def test_the_sqlite_file_and_its_wal_hold_no_plaintext(sqlite_url, kek, caplog):
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    store = open_store(StoreSettings(database_url=sqlite_url, kek=SecretStr(kek.to_base64())),
                       require_kek=True)
    try:
        with caplog.at_level(logging.DEBUG):
            # SQL with its bound parameters goes to the log too, and must hold no secret either.
            logging.getLogger("sqlalchemy.engine").setLevel(logging.INFO)
            try:
                secrets_, tokens = _populate(store)
            finally:
                logging.getLogger("sqlalchemy.engine").setLevel(logging.WARNING)
        # The SQL log and the store's own log really were captured.
        assert "INSERT INTO watermark_keys" in caplog.text and "rotated tenant acme" in caplog.text
        _assert_absent(caplog.text.encode(), secrets_, "the log")

        # The store is still open: the writes so far sit in the WAL, not yet checkpointed.
        files = _files(path)
        assert len(files.get(f"{path.name}-wal", b"")) > 0
        for name, blob in files.items():
            _assert_absent(blob, secrets_, name)
            for token in tokens:
                assert token.encode() not in blob
            assert kek.material not in blob and kek.to_base64().encode() not in blob
    finally:
        store.close()
    for name, blob in _files(path).items():  # after the checkpoint into the main file, too
        _assert_absent(blob, secrets_, name)


def test_kek_rotation_leaves_no_plaintext_behind(sqlite_url, kek):
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    store = open_store(StoreSettings(database_url=sqlite_url, kek=SecretStr(kek.to_base64())),
                       require_kek=True)
    new = Kek.generate()
    try:
        secrets_, _ = _populate(store)
        with store.transaction() as session:
            rotate_kek(session, current=store.keyring, new=new, actor=ACTOR, dependants=KEK_DEPENDANTS)
        for name, blob in _files(path).items():
            _assert_absent(blob, secrets_, name)
            assert new.material not in blob and kek.material not in blob
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_rows_hold_no_plaintext(postgres_url, kek):
    secrets_, tokens = _populated(StoreSettings(database_url=postgres_url, kek=SecretStr(kek.to_base64())))
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as connection:
            dump = "\n".join(
                row for table in APP_TABLES
                for row in connection.execute(text(f"SELECT row_to_json(t)::text FROM {table} t")).scalars()
            )
    finally:
        engine.dispose()
    _assert_absent(dump.encode(), secrets_, "PostgreSQL rows")
    _assert_absent(dump.lower().encode(), secrets_, "PostgreSQL rows (bytea as hex)")
    for token in tokens:
        assert token not in dump


def test_audit_rows_and_reprs_hold_no_secret(database_url, kek):
    settings = StoreSettings(database_url=database_url, kek=SecretStr(kek.to_base64()))
    secrets_, _ = _populated(settings)
    store = open_store(settings, require_kek=True)
    try:
        with store.transaction() as session:
            shown = [repr(list_audit(session)), str([e.to_dict() for e in list_audit(session)]),
                     repr(list_keys(session)), repr(detection_keys(session, store.keyring)),
                     repr(store.keyring), repr(settings)]
            for key in detection_keys(session, store.keyring):
                shown += [repr(key), str(key), repr(key.material), str(key.public_dict()),
                          repr(export_key(session, store.keyring, key_id=key.key_id, actor=ACTOR))]
    finally:
        store.close()
    blob = "\n".join(shown).encode()
    _assert_absent(blob, secrets_, "audit rows or reprs")
    assert kek.to_base64().encode() not in blob


def test_repr_of_a_keyring_with_two_keks():
    old, new = Kek.generate(), Kek.generate()
    shown = repr(Keyring([new, old]))
    assert old.id in shown and new.id in shown
    assert old.to_base64() not in shown and new.to_base64() not in shown
