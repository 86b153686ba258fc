"""Detection budgets charged per token scored, shared by every gateway replica.

A budget is a bucket in the store's ``rate_limit_buckets`` table (one row each, updated under
its row lock on PostgreSQL, inside SQLite's write transaction): it holds up to ``per_day``
units and refills at ``per_day`` a day. A detection is admitted while its principal's level is
positive (:meth:`Budgets.admit`, before any work), and admission takes a reservation at once,
an estimate of what the text will cost, in the same locked write; when the work is done the
difference to what it actually cost (the tokens scored) is charged or refunded. The level may
go below zero: the next detection waits until the debt is refilled. Because every admission
charges before the next one reads, detections sent at once are admitted one after another
against a falling level, as if sent in turn: the budget is overrun by at most about one text
(bounded by the tier's character limit), whatever the concurrency, and counts tokens, not
requests.

Times come from the database's clock on PostgreSQL (replicas' clocks never matter).
"""

from __future__ import annotations

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


class Budgets:
    def __init__(self, store) -> None:
        self.store = store
        self._postgres = store.engine.dialect.name == "postgresql"

    def _level(self, connection, budget: Budget, lock: bool) -> tuple[float, float]:
        name = "access:" + budget.name
        if self._postgres:
            connection.execute(text(
                "INSERT INTO rate_limit_buckets (name, level, updated) "
                "VALUES (:name, :burst, EXTRACT(EPOCH FROM clock_timestamp())) ON CONFLICT (name) DO NOTHING"),
                {"name": name, "burst": budget.per_day})
            level, updated, now = connection.execute(text(
                "SELECT level, updated, EXTRACT(EPOCH FROM clock_timestamp())::float8 FROM rate_limit_buckets "
                "WHERE name = :name" + (" FOR UPDATE" if lock else "")), {"name": name}).one()
        else:
            now = time.time()
            connection.execute(text("INSERT OR IGNORE INTO rate_limit_buckets (name, level, updated) "
                                    "VALUES (:name, :burst, :now)"), {"name": name, "burst": budget.per_day,
                                                                       "now": now})
            level, updated = connection.execute(text(
                "SELECT level, updated FROM rate_limit_buckets WHERE name = :name"), {"name": name}).one()
        return min(budget.per_day, level + max(0.0, now - updated) * budget.rate), now

    def admit(self, session, budgets: list[Budget]) -> tuple[Budget, float] | None:
        """The first budget that is used up and the seconds until it is positive again, or
        None when every one admits. The rows stay locked to the write's end, so the caller's
        reservation (:meth:`charge`, in the same write) lands before another replica reads."""
        connection = session.connection()
        for budget in sorted(budgets, key=lambda b: b.name):  # locked, in charge's order
            level, _ = self._level(connection, budget, lock=True)
            if level < 1.0:  # a whole unit (a token, an evidence use) left
                return budget, (1.0 - level) / budget.rate if budget.rate > 0 else float("inf")
        return None

    def charge(self, session, budgets: list[Budget], cost: float) -> None:
        """Take ``cost`` from every budget (the level may go below zero, down to minus one
        day's budget; a negative cost refunds, up to a full bucket)."""
        connection = session.connection()
        for budget in sorted(budgets, key=lambda b: b.name):  # one lock order: no deadlock between replicas
            level, now = self._level(connection, budget, lock=True)
            level = min(budget.per_day, max(-budget.per_day, level - cost))
            connection.execute(text("UPDATE rate_limit_buckets SET level = :level, updated = :now "
                                    "WHERE name = :name"), {"level": level, "now": now, "name": "access:" + budget.name})

    def level(self, budget: Budget) -> float:
        with self.store.transaction(write=False) as session:
            return self._level(session.connection(), budget, lock=False)[0]
