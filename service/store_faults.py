"""What the gateway does with faults found in its store (ledger.log.faults): count them, raise
an alert once per row, and say whether the transparency log is blocked.

A forged ledger row is seen on every read that touches it; the alert (an ERROR log line
beginning ``ALERT``) is written once per row and process, and
``hallmark_store_faults_total{kind}`` counts distinct rows, so a scraper sees it without a
log line per request. ``hallmark_ledger_blocked`` is 1 from an append refused because a foreign
row holds its place (generation then answers 503 ``ledger_blocked``) until an append succeeds
again (after ``hallmark ledger repair``): every generation request tries, so service returns
by itself once the row is gone.
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import Counter, Gauge

from ledger.log import faults

log = logging.getLogger("hallmark.alert")

MAX_REMEMBERED = 10_000
"""Rows alerted on, remembered (beyond, an alert may repeat: bounded memory under a flood)."""


class StoreFaults:
    def __init__(self, registry, store) -> None:
        self.count = Counter("hallmark_store_faults", "Rows found in the store that the log's writer did not write "
                             "(distinct rows), by kind.", ["kind"], registry=registry)
        self.blocked = Gauge("hallmark_ledger_blocked", "1 while appends to the transparency log are refused "
                             "because a row it did not write holds their place (`hallmark ledger repair`).",
                             registry=registry)
        for kind in faults.KINDS:
            self.count.labels(kind)
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        faults.listen(store, self.found)

    def found(self, kind: str, subject: str, message: str) -> None:
        with self._lock:
            if (kind, subject) in self._seen:
                return
            if len(self._seen) >= MAX_REMEMBERED:
                self._seen.clear()
            self._seen.add((kind, subject))
        self.count.labels(kind).inc()
        log.error("ALERT store fault (%s): %s", kind, message)

    def log_blocked(self, exc: faults.LogBlocked) -> None:
        """An append was refused (the writer never builds on a row it did not write)."""
        if not self.blocked._value.get():  # noqa: SLF001 - a gauge exposes no public read
            self.found("log_blocked", exc.what, exc.user_message)
        self.blocked.set(1)

    def appended(self) -> None:
        if self.blocked._value.get():  # noqa: SLF001
            log.warning("the transparency log accepts appends again")
            with self._lock:
                self._seen = {seen for seen in self._seen if seen[0] != "log_blocked"}
            self.blocked.set(0)
