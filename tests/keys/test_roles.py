"""Role separation on PostgreSQL: the service role appends to the ledger and the audit log
and cannot rewrite, erase, truncate or un-trigger them."""

from __future__ import annotations

import secrets

import pytest
from pydantic import SecretStr
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from keys import migrate
from keys.db import create_store_engine, open_store
from keys.errors import InvalidInput
from keys.kek import Kek
from ledger.entries import get_generation, record_generation, verify_chain
from keys.lifecycle import create_key
from keys.errors import InvalidTransition
from ledger.log.key import LogKeyError
from keys.roles import grant_service_role
from ledger.signing import active_signer, create_signing_key, rotate_signing_key
from ledger.log.tlog import ensure_log, publish, required_authority
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from tests.keys.conftest import Cli, assert_refused

pytestmark = pytest.mark.postgres


@pytest.fixture
def owned_database(pg_server):
    name = pg_server.create_database()
    url = pg_server.url_for(name)
    engine = create_store_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    role = f"hallmark_svc_{secrets.token_hex(4)}"
    with pg_server.engine.connect() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    try:
        yield url, role
    finally:
        pg_server.drop_database(name)
        with pg_server.engine.connect() as connection:
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")


def test_the_service_role_can_append_but_never_rewrite(owned_database, monkeypatch, capsys):
    url, role = owned_database
    cli = Cli(monkeypatch, capsys)
    kek = Kek.generate()
    granted = cli.ok("db", "grant-service-role", role, "--json",
                     HALLMARK_DATABASE_URL=url, HALLMARK_KEK=kek.to_base64()).json()
    assert granted["ledger_entries"] == "SELECT, INSERT" and granted["audit_events"] == "SELECT, INSERT"
    assert granted["watermark_keys"] == "SELECT" and granted["signing_keys"] == "SELECT"
    assert granted["ledger_kgrams"] == granted["log_leaves"] == granted["log_nodes"] == "SELECT, INSERT"
    assert granted["log_keys"] == "SELECT" and granted["log_head"] == "SELECT, UPDATE"
    service_url = make_url(url).set(username=role).render_as_string(hide_password=False)
    # Before the owner sets the log up, the service can neither create its key nor write unlogged.
    service = open_store(StoreSettings(database_url=service_url, kek=SecretStr(kek.to_base64())), require_kek=True)
    try:
        with pytest.raises(LogKeyError, match="ledger init"):
            with service.transaction() as session:
                ensure_log(session, service.keyring, actor="test")
    finally:
        service.close()
    owner = open_store(StoreSettings(database_url=url, kek=SecretStr(kek.to_base64())), require_kek=True)
    try:
        with owner.transaction() as session:
            tenant = create_tenant(session, name="acme", actor="test")
            create_key(session, owner.keyring, tenant="acme", actor="test")
            create_signing_key(session, owner.keyring, actor="test")  # logs the log key's creation too
    finally:
        owner.close()

    service = open_store(StoreSettings(database_url=service_url, kek=SecretStr(kek.to_base64())), require_kek=True)
    try:
        with service.transaction() as session:  # the service's own work: append and read
            entry = record_generation(session, tenant_id=tenant.id, key_id=None, key_version=None, engine="local",
                                      model="tiny", spec=None, prompt_tokens=1, watermarked_tokens=0,
                                      unwatermarked_reason="opt_out", output_text="hello", token_ids=[1])
        with service.transaction(write=False) as session:
            assert get_generation(session, generation_id=entry.id, tenant_id=tenant.id) is not None
            assert verify_chain(session).ok
            assert active_signer(session, service.keyring) is not None
        with service.transaction() as session:  # and publish checkpoints
            publish(session, required_authority(session))
        # Signing keys are the owner's: the service role can neither create nor rotate one.
        for change in (create_signing_key, rotate_signing_key):
            with pytest.raises(InvalidTransition, match="may not write signing keys"):
                with service.transaction() as session:
                    change(session, service.keyring, actor="test")
    finally:
        service.close()

    attacks = [
        "UPDATE ledger_entries SET output_tokens = 5",
        "DELETE FROM ledger_entries",
        "TRUNCATE ledger_entries",
        "ALTER TABLE ledger_entries DISABLE TRIGGER ledger_entries_append_only",
        "ALTER TABLE ledger_entries DISABLE TRIGGER ALL",
        "DROP TRIGGER ledger_entries_append_only ON ledger_entries",
        "DROP TABLE ledger_entries",
        "SET session_replication_role = replica",
        "UPDATE audit_events SET actor = 'mallory'",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events",
        "ALTER TABLE audit_events DISABLE TRIGGER ALL",
        "UPDATE watermark_keys SET state = 'revoked'",
        "DELETE FROM api_tokens",
        # The attacks through this role: a backdated "retired" signing key, retiring
        # the active one, erasing k-gram rows; and the log's own tables.
        "INSERT INTO signing_keys (id, public_key, wrapped_private, nonce, kek_id, state, created_at, retired_at) "
        "VALUES ('sk_forged', 'x', 'x', 'x', 'x', 'retired', now() - interval '300 days', now() - interval '200 days')",
        "UPDATE signing_keys SET state = 'retired', retired_at = now()",
        "DELETE FROM signing_keys",
        "DELETE FROM ledger_kgrams",
        "UPDATE ledger_kgrams SET digest = 1",
        "INSERT INTO log_keys (id, origin, public_key, wrapped_private, nonce, kek_id, created_at) "
        "VALUES (2, 'x', 'x', 'x', 'x', 'x', now())",
        "UPDATE log_keys SET origin = 'evil.example/log'",
        "UPDATE log_leaves SET kind = 'entry'",
        "DELETE FROM log_leaves",
        "TRUNCATE log_nodes",
        "DELETE FROM log_checkpoints",
        "DELETE FROM log_head",
    ]
    assert_refused(service_url, attacks, "permission denied|must be owner|append-only")
    with create_engine(url).connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM ledger_entries")).scalar() == 1


def test_grant_refuses_superusers_and_unknown_roles(owned_database):
    url, _ = owned_database
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            with pytest.raises(InvalidInput, match="no PostgreSQL role"):
                grant_service_role(connection, "no_such_role_here")
            with pytest.raises(InvalidInput, match="superuser"):
                grant_service_role(connection, "postgres")
            with pytest.raises(InvalidInput, match="identifier"):
                grant_service_role(connection, "bad; DROP TABLE x")
    finally:
        engine.dispose()
