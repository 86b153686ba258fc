"""Reading the provenance ledger: generations as the API and CLI show them, looked up by
id, by output hash (what detection cites) or page by page. See :mod:`ledger.entries` for what
an entry is. Look-ups that detection cites from (:func:`find_generations_by_output_hash`)
return only entries the transparency log holds as written (ledger.log.tlog.logged_entries)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import keyword
from collections import namedtuple
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, exists, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from keys import clock
from keys.errors import InvalidInput
from keys.models import LedgerEntry as Row
from keys.models import LogLeaf, Tenant
from ledger.chain import entry_fields
from ledger.log import faults, tlog
from ledger.log.tlog import Sequenced
from watermark.spec import WatermarkSpec

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
STALE_AFTER = timedelta(minutes=15)
"""An unfinished generation silent this long is interrupted (longer than any stream may run)."""
MAX_RESULTS = 1000


def hash_output(text: str) -> str:
    """The ledger's hash of an output: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # Field 22 (start time in clock ticks) counts from after the parenthesised command name.
    return stat.rsplit(")", 1)[-1].split()[19]


_WRITER: dict[int, str] = {}  # pid -> writer_id (a forked worker has its own pid)


def writer_id() -> str:
    """This process, as a ledger entry names its writer: ``host/pid/start-ticks`` (read from
    /proc once per process: every ledger entry names it)."""
    pid = os.getpid()
    found = _WRITER.get(pid)
    if found is None:
        found = _WRITER[pid] = f"{socket.gethostname()[:120]}/{pid}/{_process_start(pid) or '?'}"
    return found


def writer_gone(writer: str) -> bool:
    """True when ``writer`` was a process on this host that no longer runs (a reused pid is
    told apart by its start time). Writers on other hosts are never declared gone here."""
    if writer == _WRITER.get(os.getpid()):
        return False  # this process
    host, _, rest = writer.partition("/")
    pid_text, _, start = rest.partition("/")
    if host != socket.gethostname()[:120] or not pid_text.isdigit():
        return False
    current = _process_start(int(pid_text))
    if current is None:
        return os.path.exists("/proc/self/stat")  # without /proc nothing can be told
    return start != "?" and current != start


@dataclass(frozen=True)
class ChainEntry:
    """One ledger entry as stored (every hashed field, plus the entry's own hash)."""

    seq: int
    tenant_id: str
    generation_id: str
    kind: str
    created_at: datetime
    writer: str
    key_id: str | None
    key_version: int | None
    key_state: str | None
    engine: str
    model: str
    spec: dict[str, Any] | None
    prompt_tokens: int
    output_tokens: int
    watermarked_tokens: int
    unwatermarked_reason: str | None
    output_sha256: str
    token_ids_sha256: str | None
    finish_reason: str | None
    details: dict[str, Any] | None
    prev_hash: str
    entry_hash: str

    def to_dict(self) -> dict[str, Any]:
        out = entry_fields(self)
        out["entry_hash"] = self.entry_hash
        return out


def _chain_entry(row: Row) -> ChainEntry:
    return ChainEntry(**{name: getattr(row, name) for name in ChainEntry.__dataclass_fields__})


@dataclass(frozen=True)
class GenerationEntry:
    """One generation as the ledger shows it: its first entry's identity and its latest
    entry's counts, hashes and state."""

    id: str
    tenant_id: str
    tenant: str
    key_id: str | None
    key_version: int | None
    engine: str
    model: str
    spec: WatermarkSpec | None
    prompt_tokens: int
    output_tokens: int
    watermarked_tokens: int
    unwatermarked_reason: str | None
    output_sha256: str
    created_at: datetime
    status: str = "finished"
    """``in_progress``, ``finished`` or ``interrupted`` (the writer died mid-stream)."""
    finish_reason: str | None = None
    token_ids_sha256: str | None = None
    key_state: str | None = None
    seq: int = 0
    """The latest entry's position in the tenant's chain."""
    entry_hash: str = ""
    updated_at: datetime | None = None
    details: dict[str, Any] | None = None
    entries: int = 1
    kgrams_sha256: str | None = field(default=None, compare=False)
    """The latest entry's k-gram commitment in the log (ledger.log.leaves); None when not known here."""
    log: Sequenced | None = field(default=None, compare=False)
    """Where the write that returned this put its leaf in the transparency log (None on reads)."""
    fields: dict[str, Any] | None = field(default=None, compare=False)
    """The hashed fields (ledger.chain) of the entry a receipt attests, when known: a receipt
    carries them so that its content can be checked against its logged entry_hash."""

    @property
    def watermarked(self) -> bool:
        return self.watermarked_tokens > 0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "tenant_id": self.tenant_id,
                "key_id": self.key_id, "key_version": self.key_version, "key_state": self.key_state,
                "engine": self.engine, "model": self.model,
                "spec": self.spec.public_dict() if self.spec else None,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "watermarked_tokens": self.watermarked_tokens, "watermarked": self.watermarked,
                "unwatermarked_reason": self.unwatermarked_reason,
                # What the reason applies to: `dedup` beside `watermarked: true` is a share.
                "unwatermarked_tokens": self.output_tokens - self.watermarked_tokens,
                "unwatermarked_share": round((self.output_tokens - self.watermarked_tokens) / self.output_tokens, 6)
                if self.output_tokens else 0.0,
                "output_sha256": self.output_sha256, "token_ids_sha256": self.token_ids_sha256,
                "status": self.status, "finish_reason": self.finish_reason,
                "created_at": self.created_at.isoformat(),
                "updated_at": self.updated_at.isoformat() if self.updated_at else None,
                "ledger": {"seq": self.seq, "entry_hash": self.entry_hash, "entries": self.entries},
                "details": self.details}


def _status(last: Row, now: datetime) -> str:
    if last.kind == "finished":
        return "interrupted" if last.finish_reason == "interrupted" else "finished"
    if writer_gone(last.writer) or now - last.created_at > STALE_AFTER:
        return "interrupted"
    return "in_progress"


STARTED_AT = "started_at"
"""The ``details`` key of a one-entry (non-streaming) generation's start time: its record's
``created_at`` (a stream's is its ``started`` entry's time)."""


def _started_at(rows: Sequence[Row]) -> datetime:
    first = rows[0]
    started = first.details.get(STARTED_AT) if len(rows) == 1 and isinstance(first.details, dict) else None
    if isinstance(started, str):
        try:
            value = datetime.fromisoformat(started)
        except ValueError:
            return first.created_at
        if value.tzinfo is not None and value <= first.created_at:
            return value
    return first.created_at


def _generation(rows: Sequence[Row], tenant_name: str, now: datetime | None = None) -> GenerationEntry:
    first, last = rows[0], rows[-1]
    return GenerationEntry(
        id=first.generation_id, tenant_id=first.tenant_id, tenant=tenant_name, key_id=first.key_id,
        key_version=first.key_version, engine=first.engine, model=first.model,
        spec=WatermarkSpec.model_validate(first.spec) if first.spec is not None else None,
        prompt_tokens=first.prompt_tokens, output_tokens=last.output_tokens,
        watermarked_tokens=last.watermarked_tokens, unwatermarked_reason=last.unwatermarked_reason,
        output_sha256=last.output_sha256, created_at=_started_at(rows),
        status=_status(last, now or clock.utcnow()), finish_reason=last.finish_reason,
        token_ids_sha256=last.token_ids_sha256, key_state=last.key_state, seq=last.seq,
        entry_hash=last.entry_hash, updated_at=last.created_at, details=last.details, entries=len(rows))



def _check_hash(value: str, name: str = "output_sha256") -> str:
    if not isinstance(value, str) or _SHA256_HEX.fullmatch(value) is None:
        raise InvalidInput(f"{name} must be 64 lowercase hex digits (see ledger.entries.hash_output)")
    return value



# --- reading -----------------------------------------------------------------------------


def _entries_of(session: Session, generation_id: str, tenant_id: str | None = None) -> list[Row]:
    query = select(Row).where(Row.generation_id == generation_id)
    if tenant_id is not None:
        query = query.where(Row.tenant_id == tenant_id)
    return list(session.scalars(query.order_by(Row.seq)))


def authentic(session: Session, rows: Sequence[Row]) -> list[Row]:
    """Of ``rows``, those the transparency log holds as written (ledger.log.tlog.logged_entries),
    in order; the others are reported (ledger.log.faults) and left out. A row inserted or changed
    by anyone without the log key (a leaked DSN of the gateway's role) is never shown as a
    generation, signed or cited. Without the log key at hand (a session of no store, or a
    process without the KEK) nothing can be told apart and every row is kept."""
    if not rows or tlog.authority(session) is None:
        return list(rows)
    logged = tlog.logged_entries(session, rows)
    dropped = [row for row in rows if row.id not in logged]
    if dropped:
        faults.report_unlogged(session, dropped)
    return [row for row in rows if row.id in logged]


def _logged_only(session: Session):
    """A WHERE clause keeping entries that have a leaf at all (the cheap half of :func:`authentic`,
    in SQL, so that pages stay full), or None where nothing can be told apart."""
    if tlog.authority(session) is None:
        return None
    return exists().where(LogLeaf.entry_id == Row.id)


def _tenant_names(session: Session, tenant_ids: set[str]) -> dict[str, str]:
    if not tenant_ids:
        return {}
    return dict(session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(tenant_ids))).all())


def _generations(session: Session, generation_ids: Sequence[str], tenant_id: str | None) -> list[GenerationEntry]:
    if not generation_ids:
        return []
    query = select(Row).where(Row.generation_id.in_(list(generation_ids)))
    if tenant_id is not None:
        query = query.where(Row.tenant_id == tenant_id)
    grouped: dict[str, list[Row]] = {}
    for row in authentic(session, list(session.scalars(query.order_by(Row.tenant_id, Row.seq)))):
        grouped.setdefault(row.generation_id, []).append(row)
    names = _tenant_names(session, {rows[0].tenant_id for rows in grouped.values()})
    now = clock.utcnow()
    return [_generation(grouped[g], names[grouped[g][0].tenant_id], now) for g in generation_ids if g in grouped]


def get_generation(session: Session, *, generation_id: str, tenant_id: str | None) -> GenerationEntry | None:
    """The generation, or None. With ``tenant_id`` only that tenant's records are visible
    (another tenant's id reads as absent); ``tenant_id=None`` is the admin view. Required
    on purpose."""
    found = _generations(session, [generation_id], tenant_id)
    return found[0] if found else None


def latest_row(session: Session, *, generation_id: str, tenant_id: str) -> Row | None:
    """The generation's newest chain row in ``tenant_id``'s chain (what a receipt attests)."""
    rows = authentic(session, _entries_of(session, generation_id, tenant_id))
    return rows[-1] if rows else None


def generation_entries(session: Session, *, generation_id: str, tenant_id: str | None) -> list[ChainEntry]:
    """The generation's chain entries, oldest first, scoped as :func:`get_generation`."""
    return [_chain_entry(row) for row in authentic(session, _entries_of(session, generation_id, tenant_id))]


def driver_rows(connection, sql: str, params) -> list:
    """Every row of ``sql`` (the driver's parameter style) as the driver returns them (tuples).
    On SQLite straight through the driver's cursor: a result through ``exec_driver_sql`` builds
    its column metadata on every execution (~5 us a column; the detection's entry statements
    have ~30), ~0.1 ms a statement on the detection's every-request reads. The
    ``before_cursor_execute`` / ``after_cursor_execute`` listeners are still called (tests
    count statements with them) and driver errors still come as SQLAlchemy's (DBAPIError).
    Other databases: ``exec_driver_sql`` (its disconnect handling kept)."""
    if connection.dialect.name != "sqlite":
        return connection.exec_driver_sql(sql, params).fetchall()
    events = connection._has_events or connection.engine._has_events
    dbapi = connection.dialect.loaded_dbapi
    cursor = connection.connection.driver_connection.cursor()
    try:
        if events:
            connection.dispatch.before_cursor_execute(connection, cursor, sql, params, None, False)
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        if events:
            connection.dispatch.after_cursor_execute(connection, cursor, sql, params, None, False)
        return rows
    except dbapi.Error as exc:
        raise DBAPIError.instance(sql, None, exc, dbapi.Error, hide_parameters=True) from None
    finally:
        cursor.close()


class DriverStatement:
    """A Core statement compiled once per dialect and sent with ``exec_driver_sql``: the
    detection's every-request reads skip SQLAlchemy's per-execution statement handling (cache
    key, parameter processing, result metadata), ~0.1-0.2 ms a statement on this path, and
    return plain tuples (a namedtuple per statement, with ``_mapping`` as a Core row has),
    each column through its type's result processor as a Core result would give it.
    ``expanding``: the one expanding bindparam, sent as one list (SQLite: a JSON array read
    with json_each; PostgreSQL: an array). The before/after_cursor_execute events still see
    each statement (tests count them)."""

    def __init__(self, statement, expanding: str | None = None) -> None:
        self.statement = statement
        self.expanding = expanding
        self._prepared: dict[str, tuple] = {}

    def _prepare(self, dialect) -> tuple:
        compiled = self.statement.compile(dialect=dialect)
        sql = compiled.string
        if self.expanding is not None:
            marker = f"__[POSTCOMPILE_{self.expanding}]"
            if dialect.name == "sqlite":
                sql = sql.replace(marker, "SELECT value FROM json_each(?)")
            else:
                sql = sql.replace(marker, f"SELECT unnest(CAST(%({self.expanding})s AS VARCHAR[]))")
        names = [column.name for column in self.statement.selected_columns]
        processors = [column.type._cached_result_processor(dialect, None) for column in self.statement.selected_columns]
        fields = [name if name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")
                  else f"c{i}" for i, name in enumerate(names)]
        row_type = namedtuple("DriverRow", fields)
        row_type._mapping = property(lambda row: dict(zip(names, row)))
        order = list(compiled.positiontup) if dialect.positional else None
        return sql, order, dict(compiled.params), [(i, p) for i, p in enumerate(processors) if p is not None], row_type

    def rows(self, connection, params: dict[str, Any]) -> list:
        """Every row of the statement under ``params`` (values by bindparam name)."""
        dialect = connection.dialect
        prepared = self._prepared.get(dialect.name)
        if prepared is None:
            prepared = self._prepared[dialect.name] = self._prepare(dialect)
        sql, order, defaults, processors, row_type = prepared
        values = {**defaults, **params}
        if self.expanding is not None and dialect.name == "sqlite":
            values[self.expanding] = json.dumps(list(values[self.expanding]))
        elif self.expanding is not None:
            values[self.expanding] = list(values[self.expanding])
        sent = tuple(values[name] for name in order) if order is not None else values
        raw = driver_rows(connection, sql, sent)
        if not processors:
            return [row_type(*row) for row in raw]
        out = []
        for row in raw:
            row = list(row)
            for i, process in processors:
                row[i] = process(row[i])
            out.append(row_type(*row))
        return out


def _by_hash(scoped: bool):
    """Every entry (and its tenant's name) of the latest ``limit`` generations with an entry
    whose output hashes to ``output_sha256`` (in ``tenant_id`` when ``scoped``), by tenant and seq."""
    table = Row.__table__
    matching = select(Row.generation_id).where(Row.output_sha256 == bindparam("output_sha256"))
    if scoped:
        matching = matching.where(Row.tenant_id == bindparam("tenant_id"))
    matching = (matching.group_by(Row.generation_id).order_by(func.max(Row.id).desc())
                .limit(bindparam("limit")).subquery())
    # The entries' log leaves joined (tlog.leaf_columns): their check needs no second query.
    leaves = LogLeaf.__table__
    query = (select(table, Tenant.name.label("tenant_name"), *tlog.leaf_columns())
             .join(Tenant, Tenant.id == table.c.tenant_id).outerjoin(leaves, leaves.c.entry_id == table.c.id)
             .where(table.c.generation_id.in_(select(matching.c.generation_id))))
    if scoped:
        query = query.where(table.c.tenant_id == bindparam("tenant_id"))
    return query.order_by(table.c.tenant_id, table.c.seq)


_BY_HASH_ALL = DriverStatement(_by_hash(False))
_BY_HASH_OF_TENANT = DriverStatement(_by_hash(True))


def find_generations_by_output_hash(session: Session, *, output_sha256: str, tenant_id: str | None,
                                    limit: int = 100) -> list[GenerationEntry]:
    """Generations whose output (final, or as far as a checkpoint covered it) hashes to
    ``output_sha256``, newest first, scoped as :func:`get_generation`: only their entries the
    transparency log holds as written (a generation with none such is left out)."""
    _check_hash(output_sha256)
    limit = max(1, min(int(limit), MAX_RESULTS))
    # The look-up is on every /v1/detect: the matching generations' entries, with their
    # tenant's name, in one query on the Core path (rows, not ORM objects: nothing here is
    # written back), the statement built once per scope (module-level, values bound).
    conn = session.connection()
    by_hash = _BY_HASH_ALL if tenant_id is None else _BY_HASH_OF_TENANT
    rows = by_hash.rows(conn, {"output_sha256": output_sha256, "tenant_id": tenant_id, "limit": limit})
    if not rows:  # most texts: one query, no row
        return []
    last = {}
    for row in rows:
        if row.output_sha256 == output_sha256:
            last[row.generation_id] = max(last.get(row.generation_id, row.id), row.id)
    return _exact_from_rows(session, rows, last, output_sha256)


def exact_copies(session: Session, facts: "GenerationFacts | None", latest: dict[str, int], *, output_sha256: str,
                 tenant_id: str | None) -> list[GenerationEntry]:
    """:func:`find_generations_by_output_hash` from what the detection's look-up read already:
    ``latest`` (generation -> its latest entry with this output hash in scope: the k-gram
    read's part 4, ledger.kgram_cache) and those generations' entries, leaves and tenants'
    names in ``facts`` (:func:`detection_facts`). No statement of its own (issue 30)."""
    if not latest or facts is None:
        return []
    rows = sorted((row for row in facts.rows if row.generation_id in latest and row.tenant_name is not None
                   and (tenant_id is None or row.tenant_id == tenant_id)), key=lambda row: (row.tenant_id, row.seq))
    return _exact_from_rows(session, rows, latest, output_sha256)


def _exact_from_rows(session: Session, rows: Sequence, last: dict[str, int], output_sha256: str) -> list[GenerationEntry]:
    """The exact copies of :func:`find_generations_by_output_hash` from their entries ``rows``
    (by tenant and seq, with ``tenant_name`` and the leaf columns), newest first by ``last``."""
    grouped: dict[str, list[Row]] = {}
    names: dict[str, str] = {}
    for row in rows:
        grouped.setdefault(row.generation_id, []).append(row)
        names[row.tenant_id] = row.tenant_name
    ids = sorted(last, key=lambda g: last[g], reverse=True)
    # Only what the transparency log holds as written is cited: an entry inserted or edited
    # by anyone without the log key (the gateway's database role, the tables' owner) is not.
    everything = [row for found in grouped.values() for row in found]
    logged = tlog.logged_entries(session, everything, tlog.joined_leaves(everything))
    if len(logged) < len(everything) and tlog.authority(session) is not None:
        faults.report_unlogged(session, [row for row in everything if row.id not in logged])
    now = clock.utcnow()
    out = []
    for g in ids:
        kept = [row for row in grouped.get(g, ()) if row.id in logged]
        if any(row.output_sha256 == output_sha256 for row in kept):
            out.append(dataclasses.replace(_generation(kept, names[kept[0].tenant_id], now),
                                           kgrams_sha256=logged[kept[-1].id].kgrams_sha256))
    return out


MAX_OFFSET = 2 ** 62
"""The largest page offset: SQL engines take OFFSET as a signed 64-bit integer, and the offset
plus a page (plus the look-ahead row) must still fit."""


def list_generations(session: Session, *, tenant_id: str | None, limit: int = 50, offset: int = 0,
                     since: datetime | None = None, until: datetime | None = None,
                     key_id: str | None = None) -> list[GenerationEntry]:
    """Generations newest first (by their first entry), scoped as :func:`get_generation`;
    optionally only those started in [``since``, ``until``) (timezone-aware) or under ``key_id``."""
    limit = max(1, min(int(limit), MAX_RESULTS))
    offset = max(0, int(offset))
    first = func.min(Row.id)
    query = select(Row.generation_id, first)
    if tenant_id is not None:
        query = query.where(Row.tenant_id == tenant_id)
    if key_id is not None:
        query = query.where(Row.key_id == key_id)
    logged_only = _logged_only(session)
    if logged_only is not None:
        query = query.where(logged_only)
    query = query.group_by(Row.generation_id)
    if since is not None:
        query = query.having(func.min(Row.created_at) >= clock.resolve(since))
    if until is not None:
        query = query.having(func.min(Row.created_at) < clock.resolve(until))
    ids = [g for g, _ in session.execute(query.order_by(first.desc()).limit(limit).offset(offset)).all()]
    return _generations(session, ids, tenant_id)



SALT_DETAIL = "salt"
"""The ``details`` entry that records a `diverse` key's generation salt (watermark.salt).
``details`` is a hashed field (ledger.chain), so the salt is covered by the entry's hash and
hence by its transparency-log leaf; entries without it hash exactly as before."""


# Built once, the ids bound at execution (the Core path: detection reads it for every ledger match).
_SALTS = select(Row.generation_id, Row.details).where(Row.generation_id.in_(bindparam("ids", expanding=True)))


def generation_salts(session: Session, generation_ids: Sequence[str]) -> dict[str, int]:
    """generation id -> the salt its entries record (only generations that record one)."""
    if not generation_ids:
        return {}
    out: dict[str, int] = {}
    for generation_id, details in session.connection().execute(_SALTS, {"ids": list(dict.fromkeys(generation_ids))}):
        salt = details.get(SALT_DETAIL) if isinstance(details, dict) else None
        if isinstance(salt, int) and not isinstance(salt, bool):
            out[generation_id] = salt
    return out


_FACTS = (select(Row.generation_id, Row.id, Row.details, Row.key_state)
          .where(Row.generation_id.in_(bindparam("ids", expanding=True))))


def generation_facts(session: Session, generation_ids: Sequence[str]) -> tuple[dict[str, int], dict[str, str | None]]:
    """:func:`generation_salts` and :func:`keys.key_states.states_at_generation` of the same
    generations in one query (a detection reads both of what the ledger found)."""
    if not generation_ids:
        return {}, {}
    salts: dict[str, int] = {}
    latest: dict[str, tuple[int, str | None]] = {}
    for generation_id, row_id, details, key_state in session.connection().execute(
            _FACTS, {"ids": list(dict.fromkeys(generation_ids))}):
        salt = details.get(SALT_DETAIL) if isinstance(details, dict) else None
        if isinstance(salt, int) and not isinstance(salt, bool):
            salts[generation_id] = salt
        if generation_id not in latest or row_id > latest[generation_id][0]:
            latest[generation_id] = (row_id, key_state)
    return salts, {g: state for g, (_, state) in latest.items()}


@dataclass
class GenerationFacts:
    """What a detection needs of the generations the ledger matched, from one statement
    (:func:`detection_facts`): the salts and key states :func:`generation_facts` gives, each
    entry's key state now, the ``finished`` entries with the leaves the log holds them by (the
    k-gram rows' check, ledger.log.tlog.kgrams_matching), and the latest published checkpoint
    (a report's tlog-proofs, service.ledger_log.entry_proofs)."""

    salts: dict[str, int] = field(default_factory=dict)
    at_generation: dict[str, str | None] = field(default_factory=dict)
    now: dict[str, str] = field(default_factory=dict)
    finished: dict[str, Any] = field(default_factory=dict)
    """generation id -> its ``finished`` entry row."""
    leaves: dict[int, Any] = field(default_factory=dict)
    """entry id -> its log leaf (not yet checked: ledger.log.tlog.logged_entries does)."""
    published: tuple[int, str] | None = None
    """(size, note) of the latest published checkpoint; None: none published."""
    checked: frozenset[str] = frozenset()
    """The generation ids read (their finished entries are in ``finished``, if they have one)."""
    rows: list = field(default_factory=list)
    """Every entry row read (with its leaf's columns and its tenant's name: :func:`exact_copies`)."""


def _facts_statement():
    from keys.models import KeyRow as WatermarkKey, LogCheckpoint

    table, leaves, keys, checkpoints, tenants = (Row.__table__, LogLeaf.__table__, WatermarkKey.__table__,
                                                 LogCheckpoint.__table__, Tenant.__table__)
    latest = select(checkpoints.c.size).order_by(checkpoints.c.size.desc()).limit(1)
    return (select(table, *tlog.leaf_columns(), keys.c.state.label("key_state_now"),
                   tenants.c.name.label("tenant_name"),
                   latest.scalar_subquery().label("published_size"),
                   select(checkpoints.c.note).order_by(checkpoints.c.size.desc()).limit(1)
                   .scalar_subquery().label("published_note"))
            .select_from(table.outerjoin(leaves, leaves.c.entry_id == table.c.id)
                         .outerjoin(keys, keys.c.id == table.c.key_id)
                         .outerjoin(tenants, tenants.c.id == table.c.tenant_id))
            .where(table.c.generation_id.in_(bindparam("ids", expanding=True))))


_DETECTION_FACTS = DriverStatement(_facts_statement(), expanding="ids")


def detection_facts(session: Session, generation_ids: Sequence[str]) -> GenerationFacts:
    """:class:`GenerationFacts` of ``generation_ids`` in one statement (entries joined to
    their leaves and keys, the latest checkpoint as two scalar subqueries); none for no id.
    The caller has already scoped the ids to what it may see."""
    out = GenerationFacts()
    if not generation_ids:
        return out
    rows = _DETECTION_FACTS.rows(session.connection(), {"ids": list(dict.fromkeys(generation_ids))})
    latest: dict[str, tuple[int, str | None]] = {}
    for row in rows:
        details = row.details
        salt = details.get(SALT_DETAIL) if isinstance(details, dict) else None
        if isinstance(salt, int) and not isinstance(salt, bool):
            out.salts[row.generation_id] = salt
        if row.generation_id not in latest or row.id > latest[row.generation_id][0]:
            latest[row.generation_id] = (row.id, row.key_state)
        if row.key_id is not None and row.key_state_now is not None:
            out.now[row.key_id] = row.key_state_now
        if row.kind == "finished":
            out.finished[row.generation_id] = row
        if out.published is None and row.published_size is not None:
            out.published = (int(row.published_size), row.published_note)
    out.at_generation = {g: state for g, (_, state) in latest.items()}
    out.leaves = tlog.joined_leaves(rows)
    out.checked = frozenset(generation_ids)
    out.rows = rows
    return out
