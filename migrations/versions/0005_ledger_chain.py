"""Evidence-grade ledger: the hash-chained, append-only ``ledger_entries`` replaces
``generation_records``; Ed25519 ``signing_keys``; the ``store_kek`` lock row.

Revision ID: 0005_ledger_chain
Revises: 0004_rate_limits
Create Date: 2026-12-02

Existing ``generation_records`` rows become one ``finished`` entry each (finish reason
``unknown``, no token-id hash: the old table did not keep one), chained per tenant in
the order they were written (created_at, id). The chain encoding is written out here
(format v1, frozen) rather than imported, as a migration must keep meaning what it meant.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import timezone

import sqlalchemy as sa
from alembic import op

revision: str = "0005_ledger_chain"
down_revision: str | None = "0004_rate_limits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_APPEND_ONLY = "ledger_entries is append-only"
_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_FIELDS = ("tenant_id", "seq", "prev_hash", "generation_id", "kind", "created_at", "writer", "key_id",
           "key_version", "key_state", "engine", "model", "spec", "prompt_tokens", "output_tokens",
           "watermarked_tokens", "unwatermarked_reason", "output_sha256", "token_ids_sha256",
           "finish_reason", "details")


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _hash_v1(fields: dict) -> str:
    created = fields["created_at"]
    if created.tzinfo is None:
        created = created.replace(tzinfo=timezone.utc)
    fields = {**fields, "created_at": created.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    body = json.dumps({k: fields[k] for k in _FIELDS}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")
    return hashlib.sha256(b"hallmark-ledger-v1\n" + body).hexdigest()


def _ledger_table() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", _BIGINT, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("seq", _BIGINT, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("entry_hash", sa.String(64), nullable=False),
        sa.Column("generation_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        _ts("created_at"),
        sa.Column("writer", sa.String(200), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("key_version", sa.Integer(), nullable=True),
        sa.Column("key_state", sa.String(16), nullable=True),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("watermarked_tokens", sa.Integer(), nullable=False),
        sa.Column("unwatermarked_reason", sa.String(64), nullable=True),
        sa.Column("output_sha256", sa.String(64), nullable=False),
        sa.Column("token_ids_sha256", sa.String(64), nullable=True),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="RESTRICT",
                                name=op.f("fk_ledger_entries_tenant_id_tenants")),
        sa.ForeignKeyConstraint(["key_id"], ["watermark_keys.id"], ondelete="RESTRICT",
                                name=op.f("fk_ledger_entries_key_id_watermark_keys")),
        sa.UniqueConstraint("tenant_id", "seq", name=op.f("uq_ledger_entries_tenant_id_seq")),
        sa.UniqueConstraint("entry_hash", name=op.f("uq_ledger_entries_entry_hash")),
        sa.CheckConstraint("seq >= 1", name=op.f("ck_ledger_entries_seq_positive")),
        sa.CheckConstraint("kind IN ('started', 'checkpoint', 'finished')",
                           name=op.f("ck_ledger_entries_kind_known")),
        sa.CheckConstraint("(key_id IS NULL) = (key_version IS NULL)",
                           name=op.f("ck_ledger_entries_key_and_version")),
        sa.CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0 AND watermarked_tokens >= 0 "
                           "AND watermarked_tokens <= output_tokens",
                           name=op.f("ck_ledger_entries_token_counts")),
        sa.CheckConstraint("(kind = 'finished') = (finish_reason IS NOT NULL)",
                           name=op.f("ck_ledger_entries_finish_reason_iff_finished")),
    )
    op.create_index(op.f("ix_ledger_entries_generation_id"), "ledger_entries", ["generation_id"])
    op.create_index(op.f("ix_ledger_entries_key_id"), "ledger_entries", ["key_id"])
    op.create_index(op.f("ix_ledger_entries_output_sha256"), "ledger_entries", ["output_sha256"])
    for name, kind in (("uq_ledger_entries_one_start", "started"), ("uq_ledger_entries_one_finish", "finished")):
        op.create_index(name, "ledger_entries", ["generation_id"], unique=True,
                        sqlite_where=sa.text(f"kind = '{kind}'"), postgresql_where=sa.text(f"kind = '{kind}'"))


def _carry_over_records() -> None:
    if op.get_context().as_sql:
        return  # offline SQL: there are no rows to read
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        "SELECT r.id, r.tenant_id, r.key_id, r.key_version, k.state, r.engine, r.model, r.spec, "
        "r.prompt_tokens, r.output_tokens, r.watermarked_tokens, r.unwatermarked_reason, "
        "r.output_sha256, r.created_at FROM generation_records r "
        "LEFT JOIN watermark_keys k ON k.id = r.key_id ORDER BY r.created_at, r.id")).all()
    heads: dict[str, tuple[int, str]] = {}
    table = sa.table("ledger_entries", *(sa.column(n) for n in _FIELDS), sa.column("entry_hash"))
    for row in rows:
        seq, prev = heads.get(row.tenant_id, (0, "0" * 64))
        spec = row.spec if not isinstance(row.spec, str) else json.loads(row.spec)
        created = row.created_at
        if isinstance(created, str):
            from datetime import datetime

            created = datetime.fromisoformat(created)
        if created.tzinfo is None:
            created = created.replace(tzinfo=timezone.utc)
        fields = {"tenant_id": row.tenant_id, "seq": seq + 1, "prev_hash": prev, "generation_id": row.id,
                  "kind": "finished", "created_at": created, "writer": "migration-0005",
                  "key_id": row.key_id, "key_version": row.key_version, "key_state": row[4],
                  "engine": row.engine, "model": row.model, "spec": spec, "prompt_tokens": row.prompt_tokens,
                  "output_tokens": row.output_tokens, "watermarked_tokens": row.watermarked_tokens,
                  "unwatermarked_reason": row.unwatermarked_reason, "output_sha256": row.output_sha256,
                  "token_ids_sha256": None, "finish_reason": "unknown", "details": None}
        digest = _hash_v1(fields)
        stored = dict(fields)
        if bind.dialect.name == "sqlite":
            stored["created_at"] = created.astimezone(timezone.utc).replace(tzinfo=None)
        bind.execute(sa.insert(table).values(**stored, entry_hash=digest))
        heads[row.tenant_id] = (seq + 1, digest)


def _append_only_triggers() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION hallmark_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{_APPEND_ONLY}' USING ERRCODE = 'insufficient_privilege'; "
            "END $$"
        )
        op.execute("CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE ON ledger_entries "
                   "FOR EACH ROW EXECUTE FUNCTION hallmark_ledger_append_only()")
        op.execute("CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries "
                   "FOR EACH STATEMENT EXECUTE FUNCTION hallmark_ledger_append_only()")
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER ledger_entries_no_{verb.lower()} BEFORE {verb} ON ledger_entries "
                       f"BEGIN SELECT RAISE(ABORT, '{_APPEND_ONLY}'); END")


def upgrade() -> None:
    _ledger_table()
    _carry_over_records()
    op.drop_table("generation_records")
    _append_only_triggers()

    op.create_table(
        "signing_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("public_key", sa.LargeBinary(), nullable=False),
        sa.Column("wrapped_private", sa.LargeBinary(), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("kek_id", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        _ts("created_at"),
        _ts("retired_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signing_keys")),
        sa.CheckConstraint("state IN ('active', 'retired')", name=op.f("ck_signing_keys_state_known")),
    )
    op.create_index(op.f("ix_signing_keys_kek_id"), "signing_keys", ["kek_id"])
    op.create_index("uq_signing_keys_one_active", "signing_keys", ["state"], unique=True,
                    sqlite_where=sa.text("state = 'active'"), postgresql_where=sa.text("state = 'active'"))

    op.create_table(
        "store_kek",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("kek_id", sa.String(32), nullable=True),
        _ts("changed_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_kek")),
        sa.CheckConstraint("id = 1", name=op.f("ck_store_kek_single_row")),
    )
    op.execute("INSERT INTO store_kek (id, kek_id, changed_at) VALUES (1, NULL, NULL)")


def downgrade() -> None:
    op.drop_table("store_kek")
    op.drop_table("signing_keys")
    op.create_table(
        "generation_records",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("key_version", sa.Integer(), nullable=True),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("watermarked_tokens", sa.Integer(), nullable=False),
        sa.Column("unwatermarked_reason", sa.String(64), nullable=True),
        sa.Column("output_sha256", sa.String(64), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_generation_records")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="RESTRICT",
                                name=op.f("fk_generation_records_tenant_id_tenants")),
        sa.ForeignKeyConstraint(["key_id"], ["watermark_keys.id"], ondelete="RESTRICT",
                                name=op.f("fk_generation_records_key_id_watermark_keys")),
        sa.CheckConstraint("(key_id IS NULL) = (key_version IS NULL)",
                           name=op.f("ck_generation_records_key_and_version")),
        sa.CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0 AND watermarked_tokens >= 0 "
                           "AND watermarked_tokens <= output_tokens",
                           name=op.f("ck_generation_records_token_counts")),
    )
    op.create_index(op.f("ix_generation_records_tenant_id_created_at"), "generation_records",
                    ["tenant_id", "created_at"])
    op.create_index(op.f("ix_generation_records_key_id"), "generation_records", ["key_id"])
    op.create_index(op.f("ix_generation_records_output_sha256"), "generation_records", ["output_sha256"])
    # Each generation's last entry becomes its record again (the chain itself is dropped).
    op.execute(
        "INSERT INTO generation_records (id, tenant_id, key_id, key_version, engine, model, spec, "
        "prompt_tokens, output_tokens, watermarked_tokens, unwatermarked_reason, output_sha256, created_at) "
        "SELECT e.generation_id, e.tenant_id, e.key_id, e.key_version, e.engine, e.model, e.spec, "
        "e.prompt_tokens, e.output_tokens, e.watermarked_tokens, e.unwatermarked_reason, e.output_sha256, "
        "e.created_at FROM ledger_entries e WHERE e.id IN "
        "(SELECT max(id) FROM ledger_entries GROUP BY generation_id)")
    op.drop_table("ledger_entries")
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP FUNCTION hallmark_ledger_append_only()")
