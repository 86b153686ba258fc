"""The keys each detection scope tests, kept between key cache reloads.

A scope (one tenant's keys, or every tenant's) is reloaded whenever its key cache entry
expires (``key_cache_seconds``, 2 s by default) or is cleared, so that keys created,
rotated or revoked through other gateways are seen within that time. Opening a key costs an
AES-GCM unwrap and its check value, and a `diverse` key's 16 salted candidates 48 SHA-256s
more; at 10,000 keys, reopening everything every 2 s kept a core busy. A reload here reads
every row again but reopens only the rows that changed (:class:`keys.material.OpenedKeys`),
keeps the salted candidates of every unchanged key, and gives back the very same list when
nothing changed, so the detector's per-list :class:`~detector.multikey.KeySet` is kept too.
The candidates are always exactly those of opening the scope afresh.
"""

from __future__ import annotations

import threading

from detector.result import Candidate, KeyInfo, salted_candidates
from keys.db import Store
from keys.material import OpenedKeys, StoredKey


def candidate_of(stored: StoredKey) -> Candidate:
    return Candidate(key=stored.material, info=KeyInfo(
        tenant=stored.tenant, key_id=stored.key_id, version=stored.version, state=stored.state,
        fingerprint=stored.fingerprint, algorithm=stored.spec.algorithm, prf=stored.spec.prf,
        key_bits=stored.spec.key_bits))


class ScopeKeys:
    """One scope's detection candidates: a `diverse` key as its salted candidates
    (:func:`detector.result.salted_candidates`), every key in :func:`keys.material.detection_keys`'s order."""

    def __init__(self, tenant: str | None) -> None:
        self._opened = OpenedKeys(tenant)
        self._lock = threading.Lock()
        self._per_key: dict[str, tuple[StoredKey, list[Candidate]]] = {}
        self._order: list[str] = []
        self._candidates: list[Candidate] | None = None

    def load(self, store: Store) -> list[Candidate]:
        """The scope's candidates now: the previous list itself when no row changed."""
        with self._lock:
            with store.transaction(write=False) as session:
                keys = self._opened.load(session, store.keyring)
            per_key: dict[str, tuple[StoredKey, list[Candidate]]] = {}
            out: list[Candidate] = []
            reused = 0
            for key in keys:
                found = self._per_key.get(key.key_id)
                if found is not None and found[0] is key:  # the same row, so the same candidates
                    candidates = found[1]
                    reused += 1
                else:
                    candidates = salted_candidates([candidate_of(key)])
                per_key[key.key_id] = (key, candidates)
                out.extend(candidates)
            order = [key.key_id for key in keys]
            if self._candidates is not None and reused == len(keys) and order == self._order:
                return self._candidates
            self._per_key, self._order, self._candidates = per_key, order, out
            return out


class KeyScopes:
    """:class:`ScopeKeys` by scope (a tenant name, None: every tenant), at most
    ``max_scopes`` of them (beyond that all are forgotten: the next loads open afresh)."""

    def __init__(self, max_scopes: int = 1_000) -> None:
        self.max_scopes = max_scopes
        self._scopes: dict[str | None, ScopeKeys] = {}
        self._lock = threading.Lock()

    def load(self, store: Store, tenant: str | None) -> list[Candidate]:
        with self._lock:
            scope = self._scopes.get(tenant)
            if scope is None:
                if len(self._scopes) >= self.max_scopes:
                    self._scopes.clear()
                scope = self._scopes[tenant] = ScopeKeys(tenant)
        return scope.load(store)

    def clear(self) -> None:
        """Forget every opened key: the next load of each scope opens all its keys."""
        with self._lock:
            self._scopes.clear()
