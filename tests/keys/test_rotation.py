"""Concurrent rotations: real threads, separate connections, exactly one active key after."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from keys.audit import list_audit
from keys.db import open_store
from keys.lifecycle import Rotation, create_key, list_keys, rotate_key
from keys.models import KeyRow
from keys.settings import StoreSettings
from keys.tenants import create_tenant

ACTOR = "test:rotator"


def _seed(settings: StoreSettings) -> None:
    store = open_store(settings, require_kek=True)
    try:
        with store.transaction() as session:
            create_tenant(session, name="acme", actor=ACTOR)
            create_key(session, store.keyring, tenant="acme", actor=ACTOR)
    finally:
        store.close()


def _run_concurrently(settings: StoreSettings, count: int) -> tuple[list[Rotation], list[BaseException]]:
    stores = [open_store(settings, require_kek=True) for _ in range(count)]
    barrier = threading.Barrier(count)
    results: list[Rotation] = []
    errors: list[BaseException] = []

    def rotate(index: int) -> None:
        try:
            barrier.wait()
            with stores[index].transaction() as session:
                results.append(rotate_key(session, stores[index].keyring, tenant="acme", actor=ACTOR))
        except BaseException as exc:  # noqa: BLE001 - asserted by the caller
            errors.append(exc)

    threads = [threading.Thread(target=rotate, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for opened in stores:
        opened.close()
    return results, errors


def _check_one_active_chain(settings: StoreSettings, rotations: int) -> None:
    store = open_store(settings, require_kek=True)
    try:
        with store.transaction(write=False) as session:
            keys = list_keys(session, tenant="acme")
            events = list_audit(session, action="key.rotated")
    finally:
        store.close()
    assert [k.version for k in keys] == list(range(1, rotations + 2))
    assert [k.state for k in keys].count("active") == 1
    assert keys[-1].state == "active"
    # Each rotation retired the key the previous one made: a chain, no lost update.
    assert sorted(e.details["previous_version"] for e in events) == list(range(1, rotations + 1))


@pytest.mark.parametrize("count", [2, 8])
def test_concurrent_rotations_leave_exactly_one_active_key(settings, count):
    _seed(settings)
    results, errors = _run_concurrently(settings, count)
    assert errors == [] and len(results) == count
    _check_one_active_chain(settings, count)


@pytest.mark.postgres
def test_a_rotation_waits_for_the_tenant_row_lock(postgres_url, kek):
    """A rotation in flight holds the tenant's row lock: a second one blocks until the
    first commits, then rotates the key the first one made."""
    from pydantic import SecretStr

    settings = StoreSettings(database_url=postgres_url, kek=SecretStr(kek.to_base64()))
    _seed(settings)
    holder, waiter = open_store(settings, require_kek=True), open_store(settings, require_kek=True)
    outcome: dict[str, object] = {}
    try:
        session = holder.sessions()
        first = rotate_key(session, holder.keyring, tenant="acme", actor=ACTOR)

        def second() -> None:
            try:
                with waiter.transaction() as other:
                    outcome["rotation"] = rotate_key(other, waiter.keyring, tenant="acme", actor=ACTOR)
                    outcome["finished"] = datetime.now(timezone.utc)
            except BaseException as exc:  # noqa: BLE001
                outcome["error"] = exc

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive(), "the second rotation did not wait for the first"
        committed = datetime.now(timezone.utc)
        session.commit()
        session.close()
        thread.join(timeout=30)
        assert "error" not in outcome
        rotation = outcome["rotation"]
        assert outcome["finished"] >= committed
        assert rotation.previous.key_id == first.new.key_id and rotation.new.version == 3
    finally:
        holder.close()
        waiter.close()
    _check_one_active_chain(settings, 2)


def test_the_database_itself_refuses_a_second_active_key(store):
    """The partial unique index on (tenant) WHERE state = 'active', independent of locks."""
    with store.transaction() as session:
        create_tenant(session, name="acme", actor=ACTOR)
        key = create_key(session, store.keyring, tenant="acme", actor=ACTOR)
    with pytest.raises(IntegrityError, match="one_active_per_tenant|watermark_keys.tenant_id"):
        with store.sessions() as session, session.begin():
            row = session.get(KeyRow, key.key_id)
            twin = KeyRow(id="key_twin", tenant_id=row.tenant_id, version=2, wrapped_secret=row.wrapped_secret,
                          nonce=row.nonce, kek_id=row.kek_id, spec=row.spec, fingerprint="f" * 16,
                          state="active", imported=False, created_at=row.created_at)
            session.add(twin)
    with store.transaction(write=False) as session:
        assert session.scalar(select(func.count()).select_from(KeyRow)) == 1
