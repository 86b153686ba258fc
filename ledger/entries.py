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
chained per tenant (``seq``, ``prev_hash``, ``entry_hash``; :mod:`ledger.chain` has the
encoding and why per tenant) and the database refuses UPDATE, DELETE and TRUNCATE.

A generation without a ``finished`` entry whose writer process is gone (same host, dead
pid) or that has been silent for longer than :data:`STALE_AFTER` reads as
``interrupted``; a restarted gateway closes such generations with a ``finished`` entry
whose reason is ``interrupted`` (:func:`recover_interrupted`).

Records are not audit events: the ledger is itself the record of generation.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from keys import clock
from keys.errors import InvalidInput, KeyRevoked, UnknownKey
from keys.models import REVOKED
from keys.models import LedgerEntry as Row
from keys.models import KeyRow
from keys.tenants import get_tenant_by_id
from ledger import kgrams
from ledger.chain import GENESIS_HASH, entry_fields, entry_hash, hash_token_ids, timestamp
from ledger.log import tlog
from ledger.log.leaves import EMPTY_KGRAMS, kgram_commitment
from ledger.read import (MAX_OFFSET, MAX_RESULTS, STALE_AFTER, STARTED_AT, ChainEntry, GenerationEntry, _check_hash,  # noqa: F401
                         _entries_of, _generation, authentic, find_generations_by_output_hash, generation_entries,
                         get_generation, hash_output, list_generations, writer_gone, writer_id)
from ledger.verify import ChainHead, ChainProblem, ChainReport, verify_chain  # noqa: F401
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
        raise InvalidInput(f"{name} must be 64 lowercase hex digits (see ledger.entries.hash_output)")
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


def _key_state(session: Session, tenant_id: str, key_id: str | None, key_version: int | None,
               memo: dict | None = None) -> str | None:
    """The key's state now (``memo``: states already read in this transaction, by key)."""
    if memo is not None and (tenant_id, key_id, key_version) in memo:
        return memo[tenant_id, key_id, key_version]
    state = _read_key_state(session, tenant_id, key_id, key_version)
    if memo is not None:
        memo[tenant_id, key_id, key_version] = state
    return state


def _read_key_state(session: Session, tenant_id: str, key_id: str | None, key_version: int | None) -> str | None:
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


Kgrams = kgrams.KgramSet
"""A finished generation's k-grams: its key and token ids, hashed when recorded (ledger.kgrams)."""


@dataclasses.dataclass(frozen=True)
class _Appended:
    row: Row
    kgrams_sha256: str
    log: tlog.Sequenced | None


def _append(session: Session, *, tenant_id: str, values: dict[str, Any], now: datetime,
            kgram_set: Kgrams | None = None) -> _Appended:
    """Chain the entry, store its k-grams, and log it, in the caller's transaction."""
    auth = tlog.writer_authority(session)
    return _append_rows(session, auth, [(tenant_id, values, now, kgram_set, _hashed(session, auth, kgram_set))])[0]


def _hashed(session: Session, auth, kgram_set: Kgrams | None):
    """A finished generation's k-gram digests (None without k-grams). Scheme 2 under the
    store's k-gram key (the log key's; ledger.kgrams), scheme 1 only for a store with no log
    key at all (sequencing switched off before one was made); hashed before the tenant's
    chain lock is taken, which the hashing need not hold."""
    if kgram_set is None:
        return None
    keyed = auth if auth is not None else tlog.authority(session)
    return kgram_set.digests(None if keyed is None else keyed.kgram_key)


def _append_rows(session: Session, auth, items: Sequence[tuple]) -> list[_Appended]:
    """Append entries in order (``items``: tenant id, the row's values, its time, its k-gram
    set and their digests from :func:`_hashed`): each tenant's chain locked and its head read
    once, the rows chained and inserted in one flush, then each one's k-grams and log leaf
    (tlog.append_entries: the leaves in order, the head read and written once). One item is exactly one entry's append;
    many (ledger.grouped) are the same entries as one after another."""
    for tenant_id in sorted({item[0] for item in items}):  # one order: two groups never wait on each other
        _lock_chain(session, tenant_id)
    heads: dict[str, tuple[int, str]] = {}
    rows = []
    for tenant_id, values, now, _, _ in items:
        if tenant_id not in heads:
            head = session.execute(select(Row.seq, Row.entry_hash).where(Row.tenant_id == tenant_id)
                                   .order_by(Row.seq.desc()).limit(1)).first()
            heads[tenant_id] = (head[0], head[1]) if head is not None else (0, GENESIS_HASH)
        seq, prev = heads[tenant_id]
        row = Row(tenant_id=tenant_id, seq=seq + 1, prev_hash=prev, created_at=now, **values)
        row.entry_hash = entry_hash(entry_fields(row))
        heads[tenant_id] = (row.seq, row.entry_hash)
        rows.append(row)
    session.add_all(rows)
    session.flush()
    stored = [(tenant_id, row.generation_id, kgram_set.key_id, hashed[1], hashed[0])
              for row, (tenant_id, _, _, kgram_set, hashed) in zip(rows, items) if hashed is not None]
    kgrams.store_many(session, stored)
    commitments = [EMPTY_KGRAMS if hashed is None else kgram_commitment(hashed[1], hashed[0])
                   for _, _, _, _, hashed in items]
    logged = [None] * len(rows) if auth is None else \
        tlog.append_entries(session, auth, [(row, commitment, item[2])
                                            for row, commitment, item in zip(rows, commitments, items)])
    return [_Appended(row, commitment, sequenced) for row, commitment, sequenced in zip(rows, commitments, logged)]


def _logged(entry: GenerationEntry, appended: _Appended) -> GenerationEntry:
    return dataclasses.replace(entry, kgrams_sha256=appended.kgrams_sha256, log=appended.log,
                               fields=entry_fields(appended.row))


def record_generation(
    session: Session, *, tenant_id: str, key_id: str | None, key_version: int | None, engine: str,
    model: str, spec: WatermarkSpec | None, prompt_tokens: int, output_tokens: int | None = None,
    watermarked_tokens: int, unwatermarked_reason: str | None, output_text: str | None = None,
    output_sha256: str | None = None, token_ids: Sequence[int] | None = None,
    finish_reason: str = "stop", details: dict[str, Any] | None = None,
    generation_id: str | None = None, now: datetime | None = None, refuse_revoked_key: bool = False,
    kgram_set: Kgrams | None = None, started_at: datetime | None = None,
) -> GenerationEntry:
    """Record a whole generation as one ``finished`` entry, in the session's transaction.
    ``started_at``: when it began (kept in the entry's ``details``, so hashed and logged
    with it), which the record then shows as its ``created_at``; its ``updated_at`` is when
    the entry was written, i.e. when it finished.

    Give the output as ``output_text`` (hashed here) or as its ``output_sha256``, not both;
    ``token_ids`` (hashed here) fixes ``output_tokens``. ``key_id``/``key_version`` are both
    None for unwatermarked output (then ``watermarked_tokens`` must be 0); otherwise they
    must name a key of the tenant, whose current state is recorded. ``kgram_set``: the
    generation's k-grams (its key and token ids), hashed under the store's k-gram key, stored
    and committed to in the log with the entry (ledger.kgrams, ledger.log.leaves). ``refuse_revoked_key``
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
    now = clock.resolve(now)
    if started_at is not None:
        details = {**(details or {}), STARTED_AT: timestamp(min(clock.resolve(started_at), now))}
    appended = _append(session, tenant_id=tenant_id, now=now, kgram_set=kgram_set, values={
        **header, "generation_id": generation_id, "kind": "finished", "writer": writer_id(),
        **progress, "finish_reason": _check_finish(finish_reason), "details": _check_details(details)})
    return _logged(_generation([appended.row], tenant_name), appended)


def _new_generation(session: Session, *, generation_id: str | None, tenant_id: str, key_id: str | None,
                    key_version: int | None, engine: str, model: str, spec: WatermarkSpec | None,
                    prompt_tokens: int) -> tuple[str, str, dict[str, Any]]:
    """A new generation's id (checked, or made), its tenant's name and the entry's header
    columns; :class:`InvalidInput` for bad values or an id already recorded."""
    generation_id = _check_generation_id(generation_id)
    tenant = get_tenant_by_id(session, tenant_id=tenant_id)
    header = _header(key_id=key_id, key_version=key_version, engine=engine, model=model, spec=spec,
                     prompt_tokens=prompt_tokens)
    if _entries_of(session, generation_id):
        raise InvalidInput(f"generation {generation_id} is already recorded")
    return generation_id, tenant.name, header


def _header(*, key_id: str | None, key_version: int | None, engine: str, model: str, spec: WatermarkSpec | None,
            prompt_tokens: int) -> dict[str, Any]:
    if (key_id is None) != (key_version is None):
        raise InvalidInput("give key_id and key_version together, or neither")
    return {"key_id": key_id, "key_version": key_version,
            "engine": _text("engine", engine, 64), "model": _text("model", model, 200),
            "spec": spec.public_dict() if spec is not None else None,
            "prompt_tokens": _count("prompt_tokens", prompt_tokens)}


def _progress(session: Session, tenant_id: str, key_id: str | None, key_version: int | None, *,
              output_text: str | None, output_sha256: str | None, token_ids: Sequence[int] | None,
              output_tokens: int | None, watermarked_tokens: int,
              unwatermarked_reason: str | None, memo: dict | None = None) -> dict[str, Any]:
    digest, ids_digest, count = _output(output_text, output_sha256, token_ids, output_tokens)
    _count("watermarked_tokens", watermarked_tokens)
    if watermarked_tokens > count:
        raise InvalidInput("watermarked_tokens cannot exceed output_tokens")
    if key_id is None and watermarked_tokens:
        raise InvalidInput("a record without a key cannot have watermarked tokens")
    return {"key_state": _key_state(session, tenant_id, key_id, key_version, memo), "output_tokens": count,
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
    generation_id: str | None = None, now: datetime | None = None, details: dict[str, Any] | None = None,
) -> GenerationEntry:
    """The ``started`` entry of a stream: commit it before the stream's first token leaves
    (``details``: what is known before the first token, such as a `diverse` key's salt)."""
    generation_id, tenant_name, header = _new_generation(
        session, generation_id=generation_id, tenant_id=tenant_id, key_id=key_id, key_version=key_version,
        engine=engine, model=model, spec=spec, prompt_tokens=prompt_tokens)
    appended = _append(session, tenant_id=tenant_id, now=clock.resolve(now), values=_started_values(
        session, tenant_id, generation_id, header, unwatermarked_reason=unwatermarked_reason, details=details))
    return _logged(_generation([appended.row], tenant_name), appended)


def _started_values(session: Session, tenant_id: str, generation_id: str, header: dict[str, Any], *,
                    unwatermarked_reason: str | None, details: dict[str, Any] | None,
                    memo: dict | None = None) -> dict[str, Any]:
    return {**header, "generation_id": generation_id, "kind": "started", "writer": writer_id(),
            **_progress(session, tenant_id, header["key_id"], header["key_version"], output_text="",
                        output_sha256=None, token_ids=(), output_tokens=None, watermarked_tokens=0,
                        unwatermarked_reason=unwatermarked_reason, memo=memo),
            "finish_reason": None, "details": _check_details(details)}


def _continue(session: Session, *, generation_id: str, tenant_id: str, kind: str, output_text: str | None,
              token_ids: Sequence[int] | None, watermarked_tokens: int, unwatermarked_reason: str | None,
              finish_reason: str | None, details: dict[str, Any] | None, now: datetime | None,
              output_sha256: str | None = None, output_tokens: int | None = None,
              token_ids_sha256: str | None = None, kgram_set: Kgrams | None = None) -> GenerationEntry:
    rows = authentic(session, _entries_of(session, generation_id, tenant_id))  # a forged row ends no stream
    values = _continued_values(session, rows, generation_id=generation_id, tenant_id=tenant_id, kind=kind,
                               output_text=output_text, token_ids=token_ids, watermarked_tokens=watermarked_tokens,
                               unwatermarked_reason=unwatermarked_reason, finish_reason=finish_reason,
                               details=details, output_sha256=output_sha256, output_tokens=output_tokens,
                               token_ids_sha256=token_ids_sha256)
    appended = _append(session, tenant_id=tenant_id, now=clock.resolve(now), kgram_set=kgram_set, values=values)
    return _logged(_generation([*rows, appended.row], get_tenant_by_id(session, tenant_id=tenant_id).name), appended)


def _continued_values(session: Session, rows: Sequence[Row], *, generation_id: str, tenant_id: str, kind: str,
                      output_text: str | None, token_ids: Sequence[int] | None, watermarked_tokens: int,
                      unwatermarked_reason: str | None, finish_reason: str | None, details: dict[str, Any] | None,
                      output_sha256: str | None = None, output_tokens: int | None = None,
                      token_ids_sha256: str | None = None, memo: dict | None = None) -> dict[str, Any]:
    """The values of a later entry of the generation whose entries so far are ``rows``."""
    if not rows or rows[0].kind != "started":
        raise InvalidInput(f"generation {generation_id} has no started entry for this tenant")
    if rows[-1].kind == "finished":
        raise InvalidInput(f"generation {generation_id} is already finished")
    first = rows[0]
    header = {name: getattr(first, name) for name in ("key_id", "key_version", "engine", "model", "spec",
                                                      "prompt_tokens")}
    progress = _progress(session, tenant_id, first.key_id, first.key_version, output_text=output_text,
                         output_sha256=output_sha256, token_ids=token_ids, output_tokens=output_tokens,
                         watermarked_tokens=watermarked_tokens, unwatermarked_reason=unwatermarked_reason, memo=memo)
    if token_ids is None and token_ids_sha256 is not None:
        progress["token_ids_sha256"] = _check_hash(token_ids_sha256, "token_ids_sha256")
    return {**header, "generation_id": generation_id, "kind": kind, "writer": writer_id(), **progress,
            "finish_reason": finish_reason, "details": _check_details(details)}


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
    details: dict[str, Any] | None = None, now: datetime | None = None, kgram_set: Kgrams | None = None,
) -> GenerationEntry:
    """The ``finished`` entry of a stream, whatever ended it (:data:`FINISH_REASONS`), with
    the generation's k-grams (``kgram_set``) when it is watermarked."""
    return _continue(session, generation_id=generation_id, tenant_id=tenant_id, kind="finished",
                     output_text=output_text, token_ids=token_ids, watermarked_tokens=watermarked_tokens,
                     unwatermarked_reason=unwatermarked_reason, finish_reason=_check_finish(finish_reason),
                     details=details, now=now, kgram_set=kgram_set)


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


