"""What a running gateway holds: settings, the store, the engine, metrics and hot-path caches.

Domain functions (:mod:`service.generation`, :mod:`service.detection`, :mod:`service.auth`)
take this object, so they are callable without HTTP.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from detector.result import Candidate
from keys.db import Store
from keys.material import StoredKey, active_key
from keys.key_states import with_key_states
from ledger.entries import GenerationEntry, find_generations_by_output_hash
from ledger.receipts import Signer
from keys.models import LogCheckpoint
from ledger.log import tlog
from ledger.log.key import store_log_key
from ledger.log.policy import parse as parse_policy
from ledger.log.proof import format_proof
from ledger.signing import NoSigningKey, active_signer, public_keyset
from service.provenance import ledger_match, receipt_statement
from keys.tenants import get_tenant
from service.access.group_commit import GroupCommit
from service.caching import TokenCache, TTLCache
from service.engines.base import Engine
from service.key_scopes import KeyScopes
from service.errors import Unavailable
from service.metrics import Metrics
from service.limits import TenantLimits, create_buckets
from service.settings import ServiceSettings
from service.store_faults import StoreFaults
from service.token_uses import TokenUses
from service.witnessing import Witnessing
from watermark.salt import SaltRotation

log = logging.getLogger("hallmark.log")


def witnessing_of(settings: ServiceSettings) -> Witnessing | None:
    """The witnesses of the configured tlog-policy file, or None (checkpoints unwitnessed)."""
    if not settings.witness_policy:
        return None
    try:
        policy = parse_policy(Path(settings.witness_policy).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"the witness policy {settings.witness_policy} is unreadable ({type(exc).__name__})") from None
    if not policy.witnessed:
        return None
    return Witnessing(policy, timeout=settings.witness_timeout_seconds, attempts=settings.witness_attempts)


@dataclass
class Services:
    settings: ServiceSettings
    store: Store
    engine: Engine
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        settings = self.settings
        self.metrics.watch_engine(self.engine)
        ttl = settings.key_cache_seconds
        self.token_cache: TokenCache = TokenCache(ttl, settings.token_cache_entries, refresh_ahead=0.25)
        # Busy entries are reloaded off the event loop before they expire (TTLCache.refresh_ahead).
        self.key_cache: TTLCache = TTLCache(ttl, refresh_ahead=0.25)
        # What the key cache's detection scopes opened, kept across its expiries and clears:
        # a reload reopens only the keys whose rows changed (service.key_scopes).
        self.key_scopes = KeyScopes()
        self.buckets = create_buckets(settings, self.store)
        self.tenant_limits = TenantLimits(self.buckets, max_concurrent=settings.tenant_max_concurrent_generations,
                                          tokens_per_minute=settings.tenant_tokens_per_minute,
                                          token_burst=settings.token_burst)
        self.store.sequencing = settings.transparency_log
        self._published = -1  # the largest log size this process knows is published
        self._unpublished_since: float | None = None
        self._publish_lock = threading.Lock()
        self.witnessing = witnessing_of(settings)
        self._publish_wanted = threading.Event()
        self._publisher: threading.Thread | None = None
        self._publisher_lock = threading.Lock()
        # Unseeded generations of one prompt under a diverse key take the salts in turn.
        self.salts = SaltRotation()
        # Generation records (started, checkpoints, finished), committed in groups (service.generation).
        self.ledger_writes = GroupCommit(self.store, name="ledger")
        # Rows the log's writer did not write: counted, alerted once each (service.store_faults).
        self.store_faults = StoreFaults(self.metrics.registry, self.store)
        self.token_uses = TokenUses(self.store)  # when each token was last used (service.token_uses)

    def detect_wait(self, token_id: str) -> float:
        """Take one detection from the token's shared budget: 0, or seconds to wait (blocking)."""
        rate = self.settings.detect_rate_per_minute
        if rate <= 0:
            return 0.0
        return self.buckets.take(f"detect:{token_id}", 1.0, rate / 60.0, float(self.settings.detect_burst))

    def active_key(self, tenant_id: str) -> StoredKey:
        def load() -> StoredKey:
            with self.store.transaction(write=False) as session:
                return active_key(session, self.store.keyring, tenant_id=tenant_id)

        return self.key_cache.get_or_load(("active", tenant_id), load)

    def detection_candidates(self, tenant: str | None) -> list[Candidate]:
        # A `diverse` key is tested under each of its salts (detector.result.salted_candidates).
        return self.key_cache.get_or_load(("detect", tenant), lambda: self.key_scopes.load(self.store, tenant))

    def tenant_id(self, name: str) -> str:
        def load() -> str:
            with self.store.transaction(write=False) as session:
                return get_tenant(session, name=name).id

        return self.key_cache.get_or_load(("tenant", name), load)

    def ledger_matches(self, output_sha256: str, tenant_id: str | None) -> list[dict]:
        """Ledger records whose output hashes to ``output_sha256`` (scoped to a tenant, or all)."""
        with self.store.transaction(write=False) as session:  # database faults as KeyStoreError (503)
            found = find_generations_by_output_hash(session, output_sha256=output_sha256, tenant_id=tenant_id)
            return with_key_states(session, [ledger_match(e) for e in found])

    def signer(self) -> Signer | None:
        """The active signing key, opened (cached like keys); None if the store has none."""
        def load() -> Signer | None:
            try:
                with self.store.transaction(write=False) as session:
                    return active_signer(session, self.store.keyring)
            except NoSigningKey:
                return None

        return self.key_cache.get_or_load(("signer",), load)

    def public_keyset(self) -> dict:
        def load() -> dict:
            with self.store.transaction(write=False) as session:
                return public_keyset(session)

        return self.key_cache.get_or_load(("keyset",), load)

    def log_authority(self):
        """The store's log key (opened once; the gateway's start made sure there is one)."""
        cached = store_log_key(self.store, None)
        if cached is not None:
            return cached
        with self.store.transaction(write=False) as session:
            return tlog.required_authority(session)

    def receipt_for(self, entry: GenerationEntry, *, fingerprint: str | None, note: str | None = None) -> dict | None:
        """The signed receipt of a recorded generation (None when no signing key exists),
        with its transparency-log proof: a checkpoint of the tree its append committed,
        signed now (after the commit, never before), and the entry's inclusion proof, also
        as a c2sp.org/tlog-proof@v1 text. ``note``: the checkpoint of ``entry.log.size`` to
        use instead (a published one, cosigned by the witnesses)."""
        if entry.log is None and self.store.sequencing:
            # Only an entry the log holds is signed: one that is not (no leaf) is no receipt's subject.
            log.error("generation %s: its entry has no transparency-log leaf, so its receipt is null", entry.id)
            self.metrics.receipts_unsigned.inc()
            return None
        signer = self.signer()
        if signer is None:
            log.error("generation %s: no signing key in the transparency log, so its receipt is null", entry.id)
            self.metrics.receipts_unsigned.inc()
            return None
        receipt = signer.sign(receipt_statement(entry, fingerprint=fingerprint))
        if entry.log is not None:
            position = entry.log
            if note is None:
                note = tlog.signed_checkpoint(self.log_authority(), position.size, position.root)
            receipt["log"] = {"leaf_index": position.leaf_index, "tree_size": position.size, "checkpoint": note,
                              "inclusion_proof": [base64.b64encode(h).decode() for h in position.proof],
                              "tlog_proof": format_proof(position.leaf_index, position.proof, note)}
        if entry.fields is not None:
            # The attested entry's hashed fields (unsigned, like `log`): they hash to the statement's
            # entry_hash, so a verifier can bind the statement to its logged entry without trusting the
            # signature, which is what keeps it verifiable if its key is later revoked (ledger.receipts).
            receipt["entry"] = entry.fields
        return receipt

    # --- checkpoints for witnesses ---------------------------------------------------------

    def logged(self, size: int) -> None:
        """An append of this process committed at log ``size``: publish a checkpoint once
        :attr:`~service.settings.ServiceSettings.checkpoint_every_entries` entries are
        unpublished (the background task covers the time bound). With witnesses the round
        runs on the publisher thread: a generation never waits for a witness."""
        if self._unpublished_since is None:
            self._unpublished_since = time.monotonic()
        if size - self._published >= self.settings.checkpoint_every_entries:
            if self.witnessing is None:
                self.publish_checkpoint()
                return
            with self._publisher_lock:  # logged() runs on the event loop and on worker threads
                if self._publisher is None:
                    self._publisher = threading.Thread(target=self._publish_on_demand, daemon=True,
                                                       name="checkpoint-publisher")
                    self._publisher.start()
            self._publish_wanted.set()

    def _publish_on_demand(self) -> None:
        while True:
            self._publish_wanted.wait()
            self._publish_wanted.clear()
            try:
                self.publish_checkpoint()
            except Exception:  # noqa: BLE001 - a database outage: the time bound retries
                log.warning("could not publish a transparency-log checkpoint; retrying", exc_info=True)

    def publish_checkpoint(self, *, if_older_than: float | None = None) -> int | None:
        """Store a checkpoint of the log as committed now (unless that size is published),
        once the witness quorum cosigned it when witnesses are configured (service.witnessing).
        ``if_older_than``: only when this process has appended since it last published, at
        least that many seconds ago. Returns the published size, or None."""
        if if_older_than is not None and (self._unpublished_since is None
                                          or time.monotonic() - self._unpublished_since < if_older_than):
            return None
        # The time bound's round skips when a publication is under way; the entry bound waits
        # for it and publishes again: the one under way may have read the log before this
        # process's last append committed, and skipping then left N entries unpublished (the
        # flaky witness test of issue 34, item 11).
        if not self._publish_lock.acquire(blocking=if_older_than is None):
            return None  # another thread is publishing now
        try:
            signed = None
            if self.witnessing is not None:
                with self.store.transaction(write=False) as session:
                    size, root, note = tlog.current_checkpoint(session, tlog.required_authority(session))
                    published = tlog.published_size(session)
                if size <= published:
                    return published
                cosigned = self.witnessing.cosign(note, size, self._consistency)
                self.metrics.witness_rounds.labels("published" if cosigned else "short").inc()
                if cosigned is None:
                    return None
                signed = (size, root, cosigned[0])
            with self.store.transaction() as session:
                auth = tlog.required_authority(session)
                tlog.publish(session, auth, signed=signed)
                size = tlog.published_size(session)
                self._check_published(session, auth)
            self._published = max(self._published, size)
            self._unpublished_since = None
            self.metrics.checkpoints_published.inc()
            return size
        finally:
            self._publish_lock.release()

    def _check_published(self, session, auth) -> None:
        """A checkpoint row the log key did not sign, at the size this process just published (its
        publication skipped as done already) or the latest: someone without the key inserted it,
        and witnesses fetching it refuse it. Alerted (ledger.log.faults); `ledger repair` removes it."""
        from ledger.log.faults import forged_checkpoint, report

        current, _ = tlog.read_head(session, auth)
        for row in {r.size: r for r in (session.get(LogCheckpoint, current), tlog.latest_checkpoint(session))
                    if r is not None}.values():
            if forged_checkpoint(row.note, auth.verifier):
                report(session, "foreign_log_row", f"checkpoint {row.size}",
                       f"the stored checkpoint of size {row.size} is not signed by the log key: inserted without it; "
                       "witnesses refuse it (run `hallmark ledger repair`)")

    def _consistency(self, old: int, new: int) -> list[bytes]:
        with self.store.transaction(write=False) as session:
            return tlog.consistency_proof(session, old, new)

    def sign(self, statement: dict) -> dict | None:
        signer = self.signer()
        return signer.sign(statement) if signer is not None else None

    def check_database(self) -> None:
        try:
            with self.store.transaction(write=False) as session:
                session.connection().exec_driver_sql("SELECT 1")
        except Exception as exc:  # any failure means not ready
            raise Unavailable(f"database unreachable: {type(exc).__name__}") from None
