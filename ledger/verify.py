"""Verifying the provenance ledger (``hallmark ledger verify``): each tenant's hash chain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from keys.models import LedgerEntry as Row
from keys.models import Tenant
from ledger.chain import GENESIS_HASH, entry_fields, entry_hash


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

