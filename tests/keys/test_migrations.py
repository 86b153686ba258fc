"""The migrations produce exactly the models' schema, and go down and up again, on both
databases; the audit log's append-only triggers come with them."""

from __future__ import annotations

import io
import re

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, Integer, MetaData, inspect, text
from sqlalchemy.exc import DBAPIError

from keys import migrate
from keys.db import create_store_engine
from keys.models import Base
from tests.keys.conftest import APP_TABLES


def _diffs(engine: Engine, metadata: MetaData) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True,
                                                               "compare_server_default": True})
        return compare_metadata(context, metadata)


@pytest.fixture
def engine(empty_database_url):
    created = create_store_engine(empty_database_url)
    yield created
    created.dispose()


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def test_upgrade_produces_the_models_schema_then_down_and_up_again(engine):
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    assert set(APP_TABLES) <= _tables(engine)
    assert _diffs(engine, Base.metadata) == []

    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    assert _tables(engine) & set(APP_TABLES) == set()
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM pg_proc WHERE proname = "
                                           "'hallmark_audit_append_only'")).scalar() == 0

    migrate.upgrade(engine)
    assert _diffs(engine, Base.metadata) == []


def test_the_schema_comparison_would_notice_a_difference(engine):
    migrate.upgrade(engine)
    altered = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(altered)
    altered.tables["tenants"].append_column(Column("extra", Integer))
    assert any(diff[0] == "add_column" for diff in _diffs(engine, altered))


def test_partial_unique_index_and_checks_exist(engine):
    migrate.upgrade(engine)
    indexes = {ix["name"]: ix for ix in inspect(engine).get_indexes("watermark_keys")}
    assert indexes["uq_watermark_keys_one_active_per_tenant"]["unique"]
    checks = {ck["name"] for ck in inspect(engine).get_check_constraints("watermark_keys")}
    assert {"ck_watermark_keys_state_known", "ck_watermark_keys_version_positive",
            "ck_watermark_keys_revoked_iff_revoked_at"} <= checks


def _predicate(clause) -> str:
    """A partial index's predicate as text, without the parentheses and casts PostgreSQL adds."""
    return " ".join(re.sub(r"::\w+|[()]", "", str(clause)).split())


def test_partial_indexes_have_the_models_predicate_on_this_database(engine):
    """keys.models names only SQLite's predicate (start-up time); the migrations must give
    PostgreSQL the same one."""
    migrate.upgrade(engine)
    expected = {(index.table.name, index.name): _predicate(index.dialect_options["sqlite"]["where"])
                for table in Base.metadata.sorted_tables for index in table.indexes
                if index.dialect_options["sqlite"]["where"] is not None}
    assert len(expected) == 5
    option = f"{engine.dialect.name}_where"
    found = {(table, ix["name"]): _predicate(ix.get("dialect_options", {}).get(option))
             for table in {table for table, _ in expected} for ix in inspect(engine).get_indexes(table)
             if (table, ix["name"]) in expected}
    assert found == expected


def test_audit_triggers_refuse_plain_sql(engine):
    migrate.upgrade(engine)
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO audit_events (occurred_at, actor, action, details) "
                                "VALUES (CURRENT_TIMESTAMP, 'a', 'x', '{}')"))
    statements = ["UPDATE audit_events SET actor = 'mallory'", "DELETE FROM audit_events"]
    if engine.dialect.name == "postgresql":
        statements.append("TRUNCATE audit_events")
    for statement in statements:
        with pytest.raises(DBAPIError, match="append-only"):
            with engine.begin() as connection:
                connection.execute(text(statement))
    with engine.connect() as connection:
        assert connection.execute(text("SELECT actor FROM audit_events")).scalars().all() == ["a"]


@pytest.mark.parametrize("url", ["sqlite:///offline.db", "postgresql+psycopg://u@h/db"])
def test_offline_sql_generation(url):
    buffer = io.StringIO()
    config = migrate.alembic_config(url)
    config.output_buffer = buffer
    command.upgrade(config, "head", sql=True)
    sql = buffer.getvalue()
    assert "CREATE TABLE watermark_keys" in sql and "audit_events" in sql


def test_light_revision_reading_agrees_with_alembic(engine):
    """keys.migrate reads revisions without Alembic (start-up time); Alembic's answers agree."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    assert migrate.head_revision() == scripts.get_current_head()
    assert migrate.known_revisions() == {s.revision for s in scripts.walk_revisions()}
    for target in (None, migrate.head_revision()):
        if target is not None:
            migrate.upgrade(engine, target)
        with engine.connect() as connection:
            assert migrate.current_revision(engine) == MigrationContext.configure(connection).get_current_revision()


def test_case_duplicate_tenant_names_stop_the_upgrade_with_their_names_and_change_nothing(
        engine, empty_database_url, kek, monkeypatch, capsys):
    """0007 puts a unique index on lower(name): a database holding names that differ only in
    case cannot take it, so the upgrade stops, names them, and leaves the database as it was;
    after a rename (tenants are referred to by id) it goes through."""
    from alembic.util import CommandError

    from tests.keys.conftest import Cli

    migrate.upgrade(engine, "0006_kgrams")
    with engine.begin() as connection:
        for tenant_id, name in (("ten_1", "acme"), ("ten_2", "Acme"), ("ten_3", "beta"), ("ten_4", "ACME")):
            connection.execute(text("INSERT INTO tenants (id, name, created_at) VALUES (:id, :name, "
                                    "CURRENT_TIMESTAMP)"), {"id": tenant_id, "name": name})
    with pytest.raises(CommandError) as caught:
        migrate.upgrade(engine)
    message = str(caught.value)
    assert "'ACME' (id ten_4), 'Acme' (id ten_2), 'acme' (id ten_1)" in message and "beta" not in message
    assert "Nothing was changed" in message and "hallmark db upgrade" in message
    assert migrate.current_revision(engine) == "0006_kgrams"
    # The CLI says the same in one line, with a non-zero exit.
    cli = Cli(monkeypatch, capsys)
    cli.env(HALLMARK_DATABASE_URL=empty_database_url, HALLMARK_KEK=kek.to_base64())
    assert "differ only in case" in cli.fails("db", "upgrade").stderr
    assert migrate.current_revision(engine) == "0006_kgrams"

    with engine.begin() as connection:
        connection.execute(text("UPDATE tenants SET name = 'acme-2' WHERE id = 'ten_2'"))
        connection.execute(text("UPDATE tenants SET name = 'acme-3' WHERE id = 'ten_4'"))
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    with pytest.raises(DBAPIError):
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('ten_5', 'BETA', "
                                    "CURRENT_TIMESTAMP)"))
