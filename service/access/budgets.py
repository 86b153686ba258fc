"""Detection budgets charged per token scored, shared by every gateway replica.

A budget is the sum of its rows in the store's ``access_spend`` table over the last 24
hours: it holds ``per_day`` units, and a charge comes back 24 hours after it was made. Rows
are only ever inserted (issue 31: the service role could delete the old buckets and reset
every budget): a charge is a row, and a refund is a negative row that names the reservation
it settles. On PostgreSQL the migration (0012) lets the service role neither update nor
delete them, stamps every row with the database's clock, and admits a refund only once per
reservation, for at most its amount, within ten minutes of it; old rows go only through
the owner's ``hallmark_prune_access()``, which deletes nothing inside the window. On SQLite
the gateway owns the file: that is outside the defended model (docs/concepts/threat-model.md).

A detection is admitted while its principal's level is at least one unit
(:meth:`Budgets.admit`, before any work), and admission takes a reservation at once, an
estimate of what the text will cost, in the same write, under a lock per budget (an advisory
lock on PostgreSQL, SQLite's write transaction); when the work is done the difference to
what it actually cost is charged or refunded. Because every admission charges before the
next one reads, detections sent at once are admitted one after another against a falling
level: the budget is overrun by at most about one text, whatever the concurrency.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import text

DAY = 86_400.0


@dataclass(frozen=True)
class Budget:
    name: str
    per_day: float

    @property
    def rate(self) -> float:
        return self.per_day / DAY

    @property
    def row_name(self) -> str:
        return "access:" + self.name


class Budgets:
    def __init__(self, store) -> None:
        self.store = store
        self._postgres = store.engine.dialect.name == "postgresql"

    def _now(self, connection) -> float:
        if self._postgres:
            return float(connection.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")).scalar_one())
        return time.time()

    def _lock(self, connection, budget: Budget) -> None:
        if self._postgres:
            lock = int.from_bytes(hashlib.sha256(b"hallmark-budget:" + budget.row_name.encode()).digest()[:8], "big",
                                  signed=True)
            connection.execute(text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": lock})

    def _spent(self, connection, budget: Budget, now: float) -> float:
        return float(connection.execute(text(
            "SELECT COALESCE(SUM(amount), 0) FROM access_spend WHERE name = :name AND created >= :since"),
            {"name": budget.row_name, "since": now - DAY}).scalar_one())

    def _wait(self, connection, budget: Budget, now: float, short: float) -> float:
        """Seconds until ``short`` units of today's charges have aged out of the window."""
        rows = connection.execute(text(
            "SELECT created, amount FROM access_spend WHERE name = :name AND created >= :since ORDER BY created"),
            {"name": budget.row_name, "since": now - DAY}).all()
        freed = 0.0
        for created, amount in rows:
            freed += amount
            if freed >= short:
                return max(0.0, created + DAY - now)
        return DAY

    def admit(self, session, budgets: list[Budget]) -> tuple[Budget, float] | None:
        """The first budget that is used up and the seconds until it has a unit again, or
        None when every one admits. The locks hold to the write's end, so the caller's
        reservation (:meth:`charge`, in the same write) lands before another replica reads."""
        connection = session.connection()
        now = self._now(connection)
        for budget in sorted(budgets, key=lambda b: b.name):  # locked in one order: no deadlock between replicas
            self._lock(connection, budget)
            level = budget.per_day - self._spent(connection, budget, now)
            if level < 1.0:  # a whole unit (a token, an evidence use) left
                return budget, self._wait(connection, budget, now, 1.0 - level)
        return None

    def level(self, budget: Budget) -> float:
        with self.store.transaction(write=False) as session:
            connection = session.connection()
            return budget.per_day - self._spent(connection, budget, self._now(connection))

    def charge(self, session, budgets: list[Budget], cost: float,
               settles: dict[str, str] | None = None) -> dict[str, str]:
        """Charge ``cost`` to every budget: one row each. Returns budget name -> row id (the
        reservation a later refund names). A negative ``cost`` is a refund and must name, per
        budget, the reservation it settles (``settles``)."""
        connection = session.connection()
        ids = {}
        for budget in sorted(budgets, key=lambda b: b.name):
            self._lock(connection, budget)
            row = secrets.token_hex(16)
            # A settlement always names its reservation, whatever its sign (zero included): the
            # reservation's one refund is then used, and the service role cannot give it back
            # later (a token-id body scores exactly what it reserved, and wrote no row before).
            settled = (settles or {}).get(budget.name)
            if cost < 0 and settled is None:
                continue  # nothing to give back against
            connection.execute(text(
                "INSERT INTO access_spend (id, name, amount, created, settles) VALUES (:id, :name, :amount, :now, :settles)"),
                {"id": row, "name": budget.row_name, "amount": cost, "now": time.time(), "settles": settled})
            ids[budget.name] = row
        return ids


RESERVE_ADDRESSES = 10
"""A wide group's reserve is this many address groups' (bench.detect_flood --public: with one
reserve of 4,000 tokens per /24, 30 other addresses in 5 /24s checking 3 texts each while a
flood from 16 /24s had emptied the global budget got 58 of 90 checks answered)."""


def public_reserves(per_address: float, address: str, wide: str) -> list[Budget]:
    """What a public caller may still have scored once the global public budget is used up: its
    address group's reserve, within its wide group's (:data:`RESERVE_ADDRESSES` of them). A
    flood from other networks takes neither; a flood from the caller's own /24 takes at most
    the /24's, and each other address of it keeps its own until the /24's is spent."""
    return [Budget(f"public-reserve-address:{address}", per_address),
            Budget(f"public-reserve:{wide}", per_address * RESERVE_ADDRESSES)]
