"""The provenance ledger: an append-only, per-tenant hash chain of generation events.

A generation is recorded as one or more entries sharing its ``generation_id``:

- ``started``: a stream's record, written and committed *before its first token leaves*;
- ``checkpoint``: while streaming, written before the tokens it covers are sent, so that
  the ledger always covers every token a client was sent (the service checkpoints at most
  every :data:`CHECKPOINT_TOKENS` tokens);
- ``finished``: the end, with its finish reason (:data:`FINISH_REASONS`).

A non-streaming generation, which sends nothing before it is recorded, is one
``finished`` entry. Every entry repeats the whole record (tenant, key id, version and the
key's state *at the time of writing*, spec, engine, model, counts, SHA-256 of the output
text and of its token ids so far), so each entry stands alone as evidence. Entries are
chained per tenant (``seq``, ``prev_hash``, ``entry_hash``; :mod:`keys.chain` has the
encoding and why per tenant) and the database refuses UPDATE, DELETE and TRUNCATE.

A generation without a ``finished`` entry whose writer process is gone (same host, dead
pid) or that has been silent for longer than :data:`STALE_AFTER` reads as
``interrupted``; a restarted gateway closes such generations with a ``finished`` entry
whose reason is ``interrupted`` (:func:`recover_interrupted`).

Records are not audit events: the ledger is itself the record of generation.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from keys import clock
from keys.chain import GENESIS_HASH, entry_fields, entry_hash, hash_token_ids
from keys.errors import InvalidInput, KeyRevoked, UnknownKey
from keys.models import REVOKED
from keys.models import LedgerEntry as Row
from keys.models import Tenant
from keys.models import KeyRow
from keys.tenants import get_tenant_by_id
from watermark.spec import WatermarkSpec

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_REASON = re.compile(r"[a-z0-9_]{1,64}")
_GENERATION_ID = re.compile(r"[0-9a-f]{32}")
# What the service is expected to write; other lower_snake_case reasons are accepted.
UNWATERMARKED_REASONS = ("temperature_0", "opt_out", "dedup", "no_active_key")
FINISH_REASONS = ("stop", "length", "engine_failure", "remote_error", "client_disconnect", "timeout",
                  "interrupted", "unknown")
"""How a generation ended. ``interrupted``: the process died mid-stream (closed on restart);
``unknown``: a record carried over from before the chain."""
CHECKPOINT_TOKENS = 32
"""A stream is checkpointed before it sends more than this many tokens past the last entry."""
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


def writer_id() -> str:
    """This process, as a ledger entry names its writer: ``host/pid/start-ticks``."""
    pid = os.getpid()
    return f"{socket.gethostname()[:120]}/{pid}/{_process_start(pid) or '?'}"


def writer_gone(writer: str) -> bool:
    """True when ``writer`` was a process on this host that no longer runs (a reused pid is
    told apart by its start time). Writers on other hosts are never declared gone here."""
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


def _generation(rows: Sequence[Row], tenant_name: str, now: datetime | None = None) -> GenerationEntry:
    first, last = rows[0], rows[-1]
    return GenerationEntry(
        id=first.generation_id, tenant_id=first.tenant_id, tenant=tenant_name, key_id=first.key_id,
        key_version=first.key_version, engine=first.engine, model=first.model,
        spec=WatermarkSpec.model_validate(first.spec) if first.spec is not None else None,
        prompt_tokens=first.prompt_tokens, output_tokens=last.output_tokens,
        watermarked_tokens=last.watermarked_tokens, unwatermarked_reason=last.unwatermarked_reason,
        output_sha256=last.output_sha256, created_at=first.created_at,
        status=_status(last, now or clock.utcnow()), finish_reason=last.finish_reason,
        token_ids_sha256=last.token_ids_sha256, key_state=last.key_state, seq=last.seq,
        entry_hash=last.entry_hash, updated_at=last.created_at, details=last.details, entries=len(rows))


# --- validation --------------------------------------------------------------------------


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name} must be a non-negative integer")
    return value


def _text(name: str, value: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidInput(f"{name} must be a non-empty string of at most {limit} characters")
    return value


def _check_hash(value: str, name: str = "output_sha256") -> str:
    if not isinstance(value, str) or _SHA256_HEX.fullmatch(value) is None:
        raise InvalidInput(f"{name} must be 64 lowercase hex digits (see keys.ledger.hash_output)")
    return value


def _check_reason(value: str | None) -> str | None:
    if value is not None and (not isinstance(value, str) or _REASON.fullmatch(value) is None):
        raise InvalidInput("unwatermarked_reason must be lower_snake_case, e.g. 'temperature_0'")
    return value


def _check_generation_id(generation_id: str | None) -> str:
    if generation_id is None:
        return uuid.uuid4().hex
    if not isinstance(generation_id, str) or _GENERATION_ID.fullmatch(generation_id) is None:
        raise InvalidInput("generation_id must be 32 lowercase hex digits (uuid4().hex)")
    return generation_id


def _output(output_text: str | None, output_sha256: str | None,
            token_ids: Sequence[int] | None, output_tokens: int | None) -> tuple[str, str | None, int]:
    if (output_text is None) == (output_sha256 is None):
        raise InvalidInput("give exactly one of output_text and output_sha256")
    if output_text is not None and not isinstance(output_text, str):
        raise InvalidInput("output_text must be a string")
    digest = hash_output(output_text) if output_text is not None else _check_hash(output_sha256)
    ids_digest = None
    if token_ids is not None:
        ids = list(token_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**32 for t in ids):
            raise InvalidInput("token_ids must be integers in [0, 2**32)")
        ids_digest = hash_token_ids(ids)
        if output_tokens is not None and output_tokens != len(ids):
            raise InvalidInput("output_tokens must equal the number of token_ids")
        output_tokens = len(ids)
    if output_tokens is None:
        raise InvalidInput("give token_ids or output_tokens")
    return digest, ids_digest, _count("output_tokens", output_tokens)


def _key_state(session: Session, tenant_id: str, key_id: str | None, key_version: int | None) -> str | None:
    if (key_id is None) != (key_version is None):
        raise InvalidInput("give key_id and key_version together, or neither")
    if key_id is None:
        return None
    key = session.get(KeyRow, key_id, populate_existing=True)
    if key is None or key.tenant_id != tenant_id:
        raise UnknownKey(key_id)
    if key.version != key_version:
        raise InvalidInput(f"key {key_id} is version {key.version}, not {key_version}")
    return key.state


# --- appending ---------------------------------------------------------------------------


def _lock_chain(session: Session, tenant_id: str) -> None:
    """Serialise appends to one tenant's chain. SQLite write transactions are exclusive
    already (``BEGIN IMMEDIATE``); PostgreSQL takes a transaction-scoped advisory lock per
    tenant. The unique (tenant_id, seq) constraint would refuse a fork in any case."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                        {"k": f"hallmark-ledger:{tenant_id}"})


def _append(session: Session, *, tenant_id: str, values: dict[str, Any], now: datetime) -> Row:
    _lock_chain(session, tenant_id)
    head = session.execute(select(Row.seq, Row.entry_hash).where(Row.tenant_id == tenant_id)
                           .order_by(Row.seq.desc()).limit(1)).first()
    seq, prev = (head[0] + 1, head[1]) if head is not None else (1, GENESIS_HASH)
    row = Row(tenant_id=tenant_id, seq=seq, prev_hash=prev, created_at=now, **values)
    row.entry_hash = entry_hash(entry_fields(row))
    session.add(row)
    session.flush()
    return row


def _entries_of(session: Session, generation_id: str, tenant_id: str | None = None) -> list[Row]:
    query = select(Row).where(Row.generation_id == generation_id)
    if tenant_id is not None:
        query = query.where(Row.tenant_id == tenant_id)
    return list(session.scalars(query.order_by(Row.seq)))


def record_generation(
    session: Session, *, tenant_id: str, key_id: str | None, key_version: int | None, engine: str,
    model: str, spec: WatermarkSpec | None, prompt_tokens: int, output_tokens: int | None = None,
    watermarked_tokens: int, unwatermarked_reason: str | None, output_text: str | None = None,
    output_sha256: str | None = None, token_ids: Sequence[int] | None = None,
    finish_reason: str = "stop", details: dict[str, Any] | None = None,
    generation_id: str | None = None, now: datetime | None = None, refuse_revoked_key: bool = False,
) -> GenerationEntry:
    """Record a whole generation as one ``finished`` entry, in the session's transaction.

    Give the output as ``output_text`` (hashed here) or as its ``output_sha256``, not both;
    ``token_ids`` (hashed here) fixes ``output_tokens``. ``key_id``/``key_version`` are both
    None for unwatermarked output (then ``watermarked_tokens`` must be 0); otherwise they
    must name a key of the tenant, whose current state is recorded. ``refuse_revoked_key``
    raises :class:`~keys.errors.KeyRevoked` instead of recording output under a key revoked
    meanwhile (for output that has not been sent yet).
    """
    generation_id, tenant_name, header = _new_generation(
        session, generation_id=generation_id, tenant_id=tenant_id, key_id=key_id, key_version=key_version,
        engine=engine, model=model, spec=spec, prompt_tokens=prompt_tokens)
    progress = _progress(session, tenant_id, key_id, key_version, output_text=output_text,
                         output_sha256=output_sha256, token_ids=token_ids, output_tokens=output_tokens,
                         watermarked_tokens=watermarked_tokens, unwatermarked_reason=unwatermarked_reason)
    if refuse_revoked_key and progress["key_state"] == REVOKED:
        raise KeyRevoked(key_id or "")
    row = _append(session, tenant_id=tenant_id, now=clock.resolve(now), values={
        **header, "generation_id": generation_id, "kind": "finished", "writer": writer_id(),
        **progress, "finish_reason": _check_finish(finish_reason), "details": _check_details(details)})
    return _generation([row], tenant_name)


def _new_generation(session: Session, *, generation_id: str | None, tenant_id: str, key_id: str | None,
                    key_version: int | None, engine: str, model: str, spec: WatermarkSpec | None,
                    prompt_tokens: int) -> tuple[str, str, dict[str, Any]]:
    """A new generation's id (checked, or made), its tenant's name and the entry's header
    columns; :class:`InvalidInput` for bad values or an id already recorded."""
    generation_id = _check_generation_id(generation_id)
    tenant = get_tenant_by_id(session, tenant_id=tenant_id)
    if (key_id is None) != (key_version is None):
        raise InvalidInput("give key_id and key_version together, or neither")
    header = {"key_id": key_id, "key_version": key_version,
              "engine": _text("engine", engine, 64), "model": _text("model", model, 200),
              "spec": spec.public_dict() if spec is not None else None,
              "prompt_tokens": _count("prompt_tokens", prompt_tokens)}
    if _entries_of(session, generation_id):
        raise InvalidInput(f"generation {generation_id} is already recorded")
    return generation_id, tenant.name, header


def _progress(session: Session, tenant_id: str, key_id: str | None, key_version: int | None, *,
              output_text: str | None, output_sha256: str | None, token_ids: Sequence[int] | None,
              output_tokens: int | None, watermarked_tokens: int,
              unwatermarked_reason: str | None) -> dict[str, Any]:
    digest, ids_digest, count = _output(output_text, output_sha256, token_ids, output_tokens)
    _count("watermarked_tokens", watermarked_tokens)
    if watermarked_tokens > count:
        raise InvalidInput("watermarked_tokens cannot exceed output_tokens")
    if key_id is None and watermarked_tokens:
        raise InvalidInput("a record without a key cannot have watermarked tokens")
    return {"key_state": _key_state(session, tenant_id, key_id, key_version), "output_tokens": count,
            "watermarked_tokens": watermarked_tokens, "unwatermarked_reason": _check_reason(unwatermarked_reason),
            "output_sha256": digest, "token_ids_sha256": ids_digest}


def _check_finish(reason: str) -> str:
    if reason not in FINISH_REASONS:
        raise InvalidInput(f"unknown finish reason {reason!r}; expected one of {', '.join(FINISH_REASONS)}")
    return reason


def _check_details(details: dict[str, Any] | None) -> dict[str, Any] | None:
    if details is not None and not isinstance(details, dict):
        raise InvalidInput("details must be a JSON object")
    return details


def start_generation(
    session: Session, *, tenant_id: str, key_id: str | None, key_version: int | None, engine: str,
    model: str, spec: WatermarkSpec | None, prompt_tokens: int, unwatermarked_reason: str | None,
    generation_id: str | None = None, now: datetime | None = None,
) -> GenerationEntry:
    """The ``started`` entry of a stream: commit it before the stream's first token leaves."""
    generation_id, tenant_name, header = _new_generation(
        session, generation_id=generation_id, tenant_id=tenant_id, key_id=key_id, key_version=key_version,
        engine=engine, model=model, spec=spec, prompt_tokens=prompt_tokens)
    row = _append(session, tenant_id=tenant_id, now=clock.resolve(now), values={
        **header, "generation_id": generation_id, "kind": "started", "writer": writer_id(),
        **_progress(session, tenant_id, key_id, key_version, output_text="", output_sha256=None,
                    token_ids=(), output_tokens=None, watermarked_tokens=0,
                    unwatermarked_reason=unwatermarked_reason),
        "finish_reason": None, "details": None})
    return _generation([row], tenant_name)


def _continue(session: Session, *, generation_id: str, tenant_id: str, kind: str, output_text: str | None,
              token_ids: Sequence[int] | None, watermarked_tokens: int, unwatermarked_reason: str | None,
              finish_reason: str | None, details: dict[str, Any] | None, now: datetime | None,
              output_sha256: str | None = None, output_tokens: int | None = None,
              token_ids_sha256: str | None = None) -> GenerationEntry:
    rows = _entries_of(session, generation_id, tenant_id)
    if not rows or rows[0].kind != "started":
        raise InvalidInput(f"generation {generation_id} has no started entry for this tenant")
    if rows[-1].kind == "finished":
        raise InvalidInput(f"generation {generation_id} is already finished")
    first = rows[0]
    header = {name: getattr(first, name) for name in ("key_id", "key_version", "engine", "model", "spec",
                                                      "prompt_tokens")}
    progress = _progress(session, tenant_id, first.key_id, first.key_version, output_text=output_text,
                         output_sha256=output_sha256, token_ids=token_ids, output_tokens=output_tokens,
                         watermarked_tokens=watermarked_tokens, unwatermarked_reason=unwatermarked_reason)
    if token_ids is None and token_ids_sha256 is not None:
        progress["token_ids_sha256"] = _check_hash(token_ids_sha256, "token_ids_sha256")
    row = _append(session, tenant_id=tenant_id, now=clock.resolve(now), values={
        **header, "generation_id": generation_id, "kind": kind, "writer": writer_id(), **progress,
        "finish_reason": finish_reason, "details": _check_details(details)})
    return _generation([*rows, row], get_tenant_by_id(session, tenant_id=tenant_id).name)


def checkpoint_generation(
    session: Session, *, generation_id: str, tenant_id: str, output_text: str, token_ids: Sequence[int],
    watermarked_tokens: int, unwatermarked_reason: str | None = None, now: datetime | None = None,
) -> GenerationEntry:
    """A ``checkpoint`` of a stream: the whole output so far (commit before sending it)."""
    return _continue(session, generation_id=generation_id, tenant_id=tenant_id, kind="checkpoint",
                     output_text=output_text, token_ids=token_ids, watermarked_tokens=watermarked_tokens,
                     unwatermarked_reason=unwatermarked_reason, finish_reason=None, details=None, now=now)


def finish_generation(
    session: Session, *, generation_id: str, tenant_id: str, finish_reason: str, output_text: str,
    token_ids: Sequence[int], watermarked_tokens: int, unwatermarked_reason: str | None = None,
    details: dict[str, Any] | None = None, now: datetime | None = None,
) -> GenerationEntry:
    """The ``finished`` entry of a stream, whatever ended it (:data:`FINISH_REASONS`)."""
    return _continue(session, generation_id=generation_id, tenant_id=tenant_id, kind="finished",
                     output_text=output_text, token_ids=token_ids, watermarked_tokens=watermarked_tokens,
                     unwatermarked_reason=unwatermarked_reason, finish_reason=_check_finish(finish_reason),
                     details=details, now=now)


def recover_interrupted(session: Session, *, now: datetime | None = None) -> list[str]:
    """Close every unfinished generation whose writer is gone (this host, dead process) or
    that is older than :data:`STALE_AFTER` with a ``finished`` entry, reason
    ``interrupted``, carrying its last entry's counts and hashes. Returns their ids."""
    now = clock.resolve(now)
    finished = select(Row.generation_id).where(Row.kind == "finished")
    open_ids = list(session.scalars(select(Row.generation_id).where(
        Row.kind == "started", Row.generation_id.not_in(finished))))
    closed = []
    for generation_id in open_ids:
        rows = _entries_of(session, generation_id)
        last = rows[-1]
        if not (writer_gone(last.writer) or now - last.created_at > STALE_AFTER):
            continue
        _continue(session, generation_id=generation_id, tenant_id=last.tenant_id, kind="finished",
                  output_text=None, output_sha256=last.output_sha256, output_tokens=last.output_tokens,
                  token_ids=None, watermarked_tokens=last.watermarked_tokens,
                  unwatermarked_reason=last.unwatermarked_reason, finish_reason="interrupted",
                  token_ids_sha256=last.token_ids_sha256,
                  details={"recovered_by": writer_id(), "last_writer": last.writer}, now=now)
        closed.append(generation_id)
    return closed


# --- reading -----------------------------------------------------------------------------


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
    for row in session.scalars(query.order_by(Row.tenant_id, Row.seq)):
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


def generation_entries(session: Session, *, generation_id: str, tenant_id: str | None) -> list[ChainEntry]:
    """The generation's chain entries, oldest first, scoped as :func:`get_generation`."""
    return [_chain_entry(row) for row in _entries_of(session, generation_id, tenant_id)]


def find_generations_by_output_hash(session: Session, *, output_sha256: str, tenant_id: str | None,
                                    limit: int = 100) -> list[GenerationEntry]:
    """Generations whose output (final, or as far as a checkpoint covered it) hashes to
    ``output_sha256``, newest first, scoped as :func:`get_generation`."""
    _check_hash(output_sha256)
    limit = max(1, min(int(limit), MAX_RESULTS))
    query = select(Row.generation_id, func.max(Row.id).label("last")).where(Row.output_sha256 == output_sha256)
    if tenant_id is not None:
        query = query.where(Row.tenant_id == tenant_id)
    ids = [g for g, _ in session.execute(query.group_by(Row.generation_id)
                                         .order_by(func.max(Row.id).desc()).limit(limit)).all()]
    if not ids:  # most texts: one query
        return []
    # The entries with their tenant's name in one round trip (what _generations reads in two):
    # the look-up is on every /v1/detect.
    rows = select(Row, Tenant.name).join(Tenant, Tenant.id == Row.tenant_id).where(Row.generation_id.in_(ids))
    if tenant_id is not None:
        rows = rows.where(Row.tenant_id == tenant_id)
    grouped: dict[str, list[Row]] = {}
    names: dict[str, str] = {}
    for row, name in session.execute(rows.order_by(Row.tenant_id, Row.seq)):
        grouped.setdefault(row.generation_id, []).append(row)
        names[row.tenant_id] = name
    now = clock.utcnow()
    return [_generation(grouped[g], names[grouped[g][0].tenant_id], now) for g in ids if g in grouped]


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
    query = query.group_by(Row.generation_id)
    if since is not None:
        query = query.having(func.min(Row.created_at) >= clock.resolve(since))
    if until is not None:
        query = query.having(func.min(Row.created_at) < clock.resolve(until))
    ids = [g for g, _ in session.execute(query.order_by(first.desc()).limit(limit).offset(offset)).all()]
    return _generations(session, ids, tenant_id)


# --- verification ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainProblem:
    tenant_id: str
    tenant: str
    seq: int
    generation_id: str | None
    reason: str

    def __str__(self) -> str:
        where = f"tenant {self.tenant!r} entry seq {self.seq}"
        if self.generation_id:
            where += f" (generation {self.generation_id})"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class ChainHead:
    tenant_id: str
    tenant: str
    entries: int
    head_seq: int
    head_hash: str


@dataclass(frozen=True)
class ChainReport:
    heads: tuple[ChainHead, ...]
    problems: tuple[ChainProblem, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok,
                "chains": [{"tenant": h.tenant, "tenant_id": h.tenant_id, "entries": h.entries,
                            "head_seq": h.head_seq, "head_hash": h.head_hash} for h in self.heads],
                "problems": [{"tenant": p.tenant, "tenant_id": p.tenant_id, "seq": p.seq,
                              "generation_id": p.generation_id, "reason": p.reason, "message": str(p)}
                             for p in self.problems]}


def _verify_one(rows: Sequence[Row], tenant_id: str, name: str) -> ChainProblem | None:
    """The first break of one tenant's chain, in ``seq`` order, or None."""
    previous_hash, expected = GENESIS_HASH, 1
    for row in rows:
        if row.seq != expected:
            if row.seq > expected:
                reason = (f"entries seq {expected}..{row.seq - 1} are missing (deleted)" if row.seq > expected + 1
                          else f"entry seq {expected} is missing (deleted)")
                return ChainProblem(tenant_id, name, expected, None, reason)
            return ChainProblem(tenant_id, name, row.seq, row.generation_id, "duplicate sequence number (inserted)")
        if entry_hash(entry_fields(row)) != row.entry_hash:
            return ChainProblem(tenant_id, name, row.seq, row.generation_id,
                                "modified: its content does not match its entry_hash")
        if row.prev_hash != previous_hash:
            return ChainProblem(tenant_id, name, row.seq, row.generation_id,
                                "does not follow the previous entry (inserted, reordered, or its "
                                "predecessor was replaced)")
        previous_hash, expected = row.entry_hash, expected + 1
    return None


def verify_chain(session: Session, *, tenant_id: str | None = None) -> ChainReport:
    """Walk each tenant's chain (or one tenant's) and report the first break of each: a
    modified entry (its hash does not match), a deleted one (a gap in ``seq``), an inserted
    or reordered one (``prev_hash`` does not match its predecessor)."""
    names = dict(session.execute(select(Tenant.id, Tenant.name)).all())
    tenant_ids = [tenant_id] if tenant_id is not None else sorted(
        session.scalars(select(Row.tenant_id).distinct()))
    heads, problems = [], []
    for tid in tenant_ids:
        rows = list(session.scalars(select(Row).where(Row.tenant_id == tid).order_by(Row.seq, Row.id)))
        name = names.get(tid, tid)
        problem = _verify_one(rows, tid, name)
        if problem is not None:
            problems.append(problem)
        last = rows[-1] if rows else None
        heads.append(ChainHead(tid, name, len(rows), last.seq if last else 0,
                               last.entry_hash if last else GENESIS_HASH))
    return ChainReport(heads=tuple(heads), problems=tuple(problems))
