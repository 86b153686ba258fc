"""What a running gateway holds: settings, the store, the engine, metrics and hot-path caches.

Domain functions (:mod:`service.generation`, :mod:`service.detection`, :mod:`service.auth`)
take this object, so they are callable without HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from detector.result import Candidate, KeyInfo
from sqlalchemy import select

from keys.db import Store
from keys.material import StoredKey, active_key, detection_keys
from keys.models import GenerationRecord as RecordRow
from keys.models import Tenant
from keys.tenants import get_tenant
from service.caching import TTLCache
from service.engines.base import Engine
from service.errors import Unavailable
from service.metrics import Metrics
from service.ratelimit import RateLimiter
from service.settings import ServiceSettings


def candidate_of(stored: StoredKey) -> Candidate:
    return Candidate(key=stored.material, info=KeyInfo(
        tenant=stored.tenant, key_id=stored.key_id, version=stored.version, state=stored.state,
        fingerprint=stored.fingerprint, algorithm=stored.spec.algorithm))


@dataclass
class Services:
    settings: ServiceSettings
    store: Store
    engine: Engine
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        ttl = self.settings.key_cache_seconds
        self.token_cache: TTLCache = TTLCache(ttl)
        self.key_cache: TTLCache = TTLCache(ttl)
        self.detect_limiter = RateLimiter(self.settings.detect_rate_per_minute, self.settings.detect_burst)

    def active_key(self, tenant_id: str) -> StoredKey:
        def load() -> StoredKey:
            with self.store.transaction(write=False) as session:
                return active_key(session, self.store.keyring, tenant_id=tenant_id)

        return self.key_cache.get_or_load(("active", tenant_id), load)

    def detection_candidates(self, tenant: str | None) -> list[Candidate]:
        def load() -> list[Candidate]:
            with self.store.transaction(write=False) as session:
                return [candidate_of(k) for k in detection_keys(session, self.store.keyring, tenant=tenant)]

        return self.key_cache.get_or_load(("detect", tenant), load)

    def tenant_id(self, name: str) -> str:
        def load() -> str:
            with self.store.transaction(write=False) as session:
                return get_tenant(session, name=name).id

        return self.key_cache.get_or_load(("tenant", name), load)

    def ledger_matches(self, output_sha256: str, tenant_id: str | None) -> list[dict]:
        """Ledger records whose output hashes to ``output_sha256`` (a lean Core query: this
        runs on every detection)."""
        query = (select(RecordRow.id, Tenant.name, RecordRow.key_id, RecordRow.key_version, RecordRow.engine,
                        RecordRow.model, RecordRow.watermarked_tokens, RecordRow.created_at)
                 .join(Tenant, Tenant.id == RecordRow.tenant_id)
                 .where(RecordRow.output_sha256 == output_sha256)
                 .order_by(RecordRow.created_at.desc()).limit(100))
        if tenant_id is not None:
            query = query.where(RecordRow.tenant_id == tenant_id)
        with self.store.engine.connect() as connection:
            rows = connection.execute(query).all()
        return [{"generation_id": r[0], "tenant": r[1], "key_id": r[2], "key_version": r[3], "engine": r[4],
                 "model": r[5], "watermarked_tokens": r[6], "created_at": r[7].isoformat()} for r in rows]

    def check_database(self) -> None:
        try:
            with self.store.transaction(write=False) as session:
                session.connection().exec_driver_sql("SELECT 1")
        except Exception as exc:  # any failure means not ready
            raise Unavailable(f"database unreachable: {type(exc).__name__}") from None
