"""The provenance ledger: one record per generation, written by the service.

A record says who generated (tenant), under which key version and spec, with which
engine and model, how many tokens were watermarked (and why not, when none or not all
were), and the SHA-256 of the output text, so that an exact copy can be confirmed later
without the text being stored. Records are not audit events: the ledger is itself the
record of generation, and auditing each one would double it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from keys import clock
from keys.errors import InvalidInput, UnknownKey
from keys.models import GenerationRecord as RecordRow
from keys.models import Tenant
from keys.models import WatermarkKey as KeyRow
from keys.tenants import get_tenant_by_id
from watermark.spec import WatermarkSpec

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_REASON = re.compile(r"[a-z0-9_]{1,64}")
# What the service is expected to write; other lower_snake_case reasons are accepted.
UNWATERMARKED_REASONS = ("temperature_0", "opt_out", "dedup", "no_active_key")
MAX_RESULTS = 1000


def hash_output(text: str) -> str:
    """The ledger's hash of an output: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class GenerationEntry:
    """One ledger record."""

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

    @property
    def watermarked(self) -> bool:
        return self.watermarked_tokens > 0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "tenant_id": self.tenant_id,
                "key_id": self.key_id, "key_version": self.key_version, "engine": self.engine,
                "model": self.model, "spec": self.spec.public_dict() if self.spec else None,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "watermarked_tokens": self.watermarked_tokens, "watermarked": self.watermarked,
                "unwatermarked_reason": self.unwatermarked_reason,
                "output_sha256": self.output_sha256, "created_at": self.created_at.isoformat()}


def _entry(row: RecordRow, tenant_name: str) -> GenerationEntry:
    return GenerationEntry(
        id=row.id, tenant_id=row.tenant_id, tenant=tenant_name, key_id=row.key_id,
        key_version=row.key_version, engine=row.engine, model=row.model,
        spec=WatermarkSpec.model_validate(row.spec) if row.spec is not None else None,
        prompt_tokens=row.prompt_tokens, output_tokens=row.output_tokens,
        watermarked_tokens=row.watermarked_tokens, unwatermarked_reason=row.unwatermarked_reason,
        output_sha256=row.output_sha256, created_at=row.created_at,
    )


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name} must be a non-negative integer")
    return value


def _text(name: str, value: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidInput(f"{name} must be a non-empty string of at most {limit} characters")
    return value


def _check_hash(value: str) -> str:
    if not isinstance(value, str) or _SHA256_HEX.fullmatch(value) is None:
        raise InvalidInput("output_sha256 must be 64 lowercase hex digits (see keys.ledger.hash_output)")
    return value


def record_generation(
    session: Session, *, tenant_id: str, key_id: str | None, key_version: int | None, engine: str,
    model: str, spec: WatermarkSpec | None, prompt_tokens: int, output_tokens: int,
    watermarked_tokens: int, unwatermarked_reason: str | None, output_text: str | None = None,
    output_sha256: str | None = None, generation_id: str | None = None, now: datetime | None = None,
) -> GenerationEntry:
    """Write a ledger record in the session's transaction.

    Give the output as ``output_text`` (hashed here) or as its ``output_sha256``, not both.
    ``key_id``/``key_version`` are both None for unwatermarked output (then
    ``watermarked_tokens`` must be 0); otherwise they must name a key of the tenant.
    """
    if (output_text is None) == (output_sha256 is None):
        raise InvalidInput("give exactly one of output_text and output_sha256")
    if output_text is not None and not isinstance(output_text, str):
        raise InvalidInput("output_text must be a string")
    digest = hash_output(output_text) if output_text is not None else _check_hash(output_sha256)
    for name, value in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens),
                        ("watermarked_tokens", watermarked_tokens)):
        _count(name, value)
    if watermarked_tokens > output_tokens:
        raise InvalidInput("watermarked_tokens cannot exceed output_tokens")
    if unwatermarked_reason is not None and _REASON.fullmatch(unwatermarked_reason) is None:
        raise InvalidInput("unwatermarked_reason must be lower_snake_case, e.g. 'temperature_0'")
    if (key_id is None) != (key_version is None):
        raise InvalidInput("give key_id and key_version together, or neither")
    tenant = get_tenant_by_id(session, tenant_id=tenant_id)
    if key_id is None:
        if watermarked_tokens:
            raise InvalidInput("a record without a key cannot have watermarked tokens")
    else:
        key = session.get(KeyRow, key_id)
        if key is None or key.tenant_id != tenant_id:
            raise UnknownKey(key_id)
        if key.version != key_version:
            raise InvalidInput(f"key {key_id} is version {key.version}, not {key_version}")
    if generation_id is None:
        generation_id = uuid.uuid4().hex
    elif not isinstance(generation_id, str) or re.fullmatch(r"[0-9a-f]{32}", generation_id) is None:
        raise InvalidInput("generation_id must be 32 lowercase hex digits (uuid4().hex)")
    row = RecordRow(id=generation_id, tenant_id=tenant_id, key_id=key_id, key_version=key_version,
                    engine=_text("engine", engine, 64), model=_text("model", model, 200),
                    spec=spec.public_dict() if spec is not None else None,
                    prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                    watermarked_tokens=watermarked_tokens, unwatermarked_reason=unwatermarked_reason,
                    output_sha256=digest, created_at=clock.resolve(now))
    session.add(row)
    session.flush()
    return _entry(row, tenant.name)


def get_generation(session: Session, *, generation_id: str, tenant_id: str | None) -> GenerationEntry | None:
    """The record, or None. With ``tenant_id`` only that tenant's records are visible (another
    tenant's id reads as absent); ``tenant_id=None`` is the admin view. Required on purpose."""
    query = (select(RecordRow, Tenant.name).join(Tenant, Tenant.id == RecordRow.tenant_id)
             .where(RecordRow.id == generation_id))
    if tenant_id is not None:
        query = query.where(RecordRow.tenant_id == tenant_id)
    found = session.execute(query).first()
    return _entry(found[0], found[1]) if found is not None else None


def find_generations_by_output_hash(session: Session, *, output_sha256: str, tenant_id: str | None,
                                    limit: int = 100) -> list[GenerationEntry]:
    """Records whose output hashes to ``output_sha256``, newest first, scoped as
    :func:`get_generation`."""
    _check_hash(output_sha256)
    limit = max(1, min(int(limit), MAX_RESULTS))
    query = (select(RecordRow, Tenant.name).join(Tenant, Tenant.id == RecordRow.tenant_id)
             .where(RecordRow.output_sha256 == output_sha256))
    if tenant_id is not None:
        query = query.where(RecordRow.tenant_id == tenant_id)
    rows = session.execute(query.order_by(RecordRow.created_at.desc(), RecordRow.id).limit(limit)).all()
    return [_entry(row, name) for row, name in rows]
