"""When each API token was last used: seen on every authenticated request, kept in memory and
written to the store (keys.tokens.record_uses) at most every :data:`FLUSH_EVERY` seconds, in one
transaction, so that a busy token costs no write per request. A flush that fails (the database
down) keeps what it had for the next one."""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from keys import clock
from keys.tokens import last_uses, record_uses

log = logging.getLogger("hallmark.auth")

FLUSH_EVERY = 30.0


class TokenUses:
    def __init__(self, store) -> None:
        self.store = store
        self._pending: dict[str, datetime] = {}
        self._seen: dict[str, datetime] = {}  # this process's latest sighting of each token (bounded)
        self._lock = threading.Lock()

    def saw(self, token_id: str) -> datetime | None:
        """Note a use now; returns the previous use this process saw (None if none)."""
        now = clock.utcnow()
        with self._lock:
            previous = self._seen.get(token_id)
            if len(self._seen) >= 100_000:
                self._seen.clear()
            self._seen[token_id] = now
            self._pending[token_id] = now
        return previous

    def last_use(self, token_id: str, before_now: datetime | None) -> datetime | None:
        """The use before the current one: this process's, else the store's."""
        if before_now is not None:
            return before_now
        with self.store.transaction(write=False) as session:
            return last_uses(session, [token_id]).get(token_id)

    def flush(self) -> int:
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return 0
        try:
            with self.store.transaction() as session:
                record_uses(session, pending)
        except Exception:
            with self._lock:
                for token_id, when in pending.items():
                    self._pending[token_id] = max(when, self._pending.get(token_id, when))
            raise
        return len(pending)
