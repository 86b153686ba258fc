"""The store's clock: timezone-aware UTC. Domain functions take ``now`` to make it injectable."""

from __future__ import annotations

from datetime import datetime, timezone

from keys.errors import InvalidInput


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def resolve(now: datetime | None) -> datetime:
    """``now`` if given (must be timezone-aware), else the current time."""
    if now is None:
        return utcnow()
    if now.tzinfo is None or now.utcoffset() is None:
        raise InvalidInput("timestamps must be timezone-aware; use datetime.now(timezone.utc)")
    return now.astimezone(timezone.utc)
