"""Many streams' ledger entries appended together: what the gateway's grouped writer
(service.access.group_commit) runs for the stream entries waiting at one moment.

Each entry is the one :func:`ledger.entries.start_generation`, ``checkpoint_generation`` or
``finish_generation`` would append, called one after another in the same order: the same
checks, the same chain (seq, prev_hash, entry_hash), k-grams and log leaf (through the same
``tlog.append_entry``, leaf after leaf). What the entries share is the work around them,
which cost more than the entries themselves (about 10 ms an entry on SQLite, most of it
the ORM's per-statement overhead: bench/ledger_groups.py): the log key, the tenants and
each key's state read once, the generations' earlier entries in one query, each tenant's
chain locked and its head read once, the rows inserted in one flush.

Any write that would be refused raises here, and the caller runs the writes one by one
instead, so that each request gets its own answer (a refused write never takes the
others down with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from keys import clock
from keys.errors import InvalidInput
from keys.models import LedgerEntry as Row
from keys.tenants import get_tenant_by_id
from ledger import entries
from ledger.log import tlog
from ledger.read import GenerationEntry, _generation, _tenant_names, authentic

STARTED, CHECKPOINT, FINISHED = "started", "checkpoint", "finished"
_START_HEADER = ("key_id", "key_version", "engine", "model", "spec", "prompt_tokens")


def append_many(session: Session, writes: Sequence[tuple[str, dict[str, Any]]]) -> list[GenerationEntry]:
    """Append ``writes`` in order, each (kind, the keyword arguments of
    ``start_generation``/``checkpoint_generation``/``finish_generation`` for ``started``,
    ``checkpoint``, ``finished``), in the session's transaction; their entries, in order.
    Raises what any one of them would (then nothing of them is written: run each alone)."""
    ids = [kwargs.get("generation_id") for _, kwargs in writes]
    if None in ids or len(set(ids)) != len(ids):  # one entry per generation (and every id given)
        raise InvalidInput("a group appends one entry per generation, each with its id")
    auth = tlog.writer_authority(session)
    tenant_ids = {kwargs["tenant_id"] for _, kwargs in writes}
    names = _tenant_names(session, tenant_ids)
    for missing in tenant_ids - set(names):
        get_tenant_by_id(session, tenant_id=missing)  # raises the single write's UnknownTenant
    earlier: dict[str, list[Row]] = {}
    # as the single writes do: a row the log does not hold (a forged one) ends no stream
    for row in authentic(session, list(session.scalars(select(Row).where(Row.generation_id.in_(ids))
                                                       .order_by(Row.seq)))):
        earlier.setdefault(row.generation_id, []).append(row)
    memo: dict = {}
    items, before = [], []
    for kind, kwargs in writes:
        tenant_id, generation_id = kwargs["tenant_id"], entries._check_generation_id(kwargs["generation_id"])
        kgram_set = None
        if kind == STARTED:
            header = entries._header(**{name: kwargs[name] for name in _START_HEADER})
            if earlier.get(generation_id):
                raise InvalidInput(f"generation {generation_id} is already recorded")
            values = entries._started_values(session, tenant_id, generation_id, header,
                                             unwatermarked_reason=kwargs["unwatermarked_reason"],
                                             details=kwargs.get("details"), memo=memo)
            rows = []
        elif kind in (CHECKPOINT, FINISHED):
            rows = [r for r in earlier.get(generation_id, []) if r.tenant_id == tenant_id]
            kgram_set = kwargs.get("kgram_set")
            reason = entries._check_finish(kwargs["finish_reason"]) if kind == FINISHED else None
            values = entries._continued_values(
                session, rows, generation_id=generation_id, tenant_id=tenant_id, kind=kind,
                output_text=kwargs["output_text"], token_ids=kwargs["token_ids"],
                watermarked_tokens=kwargs["watermarked_tokens"],
                unwatermarked_reason=kwargs.get("unwatermarked_reason"), finish_reason=reason,
                details=kwargs.get("details"), memo=memo)
        else:
            raise ValueError(f"unknown ledger write {kind!r}")
        now = clock.resolve(kwargs.get("now"))
        items.append((tenant_id, values, now, kgram_set, entries._hashed(session, auth, kgram_set)))
        before.append(rows)
    appended = entries._append_rows(session, auth, items)
    return [entries._logged(_generation([*rows, done.row], names[done.row.tenant_id]), done)
            for rows, done in zip(before, appended)]
