"""KEK rotation on PostgreSQL against concurrent key writers, the staged (previous) KEK and
`kek status`.

The race: a rotation that locks only the rows it sees at the start lets a tenant and key
created meanwhile (under the old KEK) commit after it, never re-wrapped. The deterministic
test holds a writer open across the rotation's start; the stress test runs writers in a
loop around a rotation. Both end with every key opening under the new KEK.
"""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import SecretStr

from keys.db import open_store
from keys.errors import KekError, KeyStoreError
from keys.kek import Kek, Keyring, load_keyring
from keys.kek_rotation import kek_status, rotate_kek
from ledger.sealed import KEK_DEPENDANTS
from keys.lifecycle import create_key, rotate_key
from keys.material import detection_keys
from keys.models import KeyRow, SigningKey
from keys.settings import StoreSettings
from ledger.signing import active_signer, create_signing_key
from keys.tenants import create_tenant

ACTOR = "test"


def _open(url: str, kek: Kek):
    return open_store(StoreSettings(database_url=url, kek=SecretStr(kek.to_base64())), require_kek=True)


def _a_backend_waits_on_a_lock(store) -> bool:
    with store.engine.connect() as connection:
        waiting = connection.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'").scalar()
    return bool(waiting)


def _assert_all_under(store, new: Kek) -> int:
    with store.transaction(write=False) as session:
        kek_ids = {row.kek_id for row in session.query(KeyRow)} | {r.kek_id for r in session.query(SigningKey)}
        opened = detection_keys(session, Keyring([new]))
        active_signer(session, Keyring([new]))
    assert kek_ids == {new.id}, kek_ids
    return len(opened)


@pytest.mark.postgres
def test_a_key_written_across_the_rotations_start_is_rewrapped(postgres_url):
    old, new = Kek.generate(), Kek.generate()
    store = _open(postgres_url, old)
    try:
        with store.transaction() as session:
            create_tenant(session, name="acme", actor=ACTOR)
            create_key(session, store.keyring, tenant="acme", actor=ACTOR)
            create_signing_key(session, store.keyring, actor=ACTOR)
        writer_ready, release = threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def writer() -> None:
            try:
                with store.transaction() as session:
                    create_tenant(session, name="latecomer", actor=ACTOR)
                    create_key(session, store.keyring, tenant="latecomer", actor=ACTOR)
                    writer_ready.set()
                    release.wait(10)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                writer_ready.set()

        def rotation() -> None:
            try:
                with store.transaction() as session:
                    rotate_kek(session, current=store.keyring, new=new, actor=ACTOR, dependants=KEK_DEPENDANTS)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        w = threading.Thread(target=writer)
        w.start()
        assert writer_ready.wait(10)
        r = threading.Thread(target=rotation)
        r.start()
        # Release the writer only once the rotation is blocked on its lock (PostgreSQL says
        # so in pg_stat_activity), or has finished without waiting (the unfixed race).
        deadline = time.monotonic() + 30
        while r.is_alive() and not _a_backend_waits_on_a_lock(store) and time.monotonic() < deadline:
            time.sleep(0.02)
        release.set()
        w.join(20)
        r.join(20)
        assert not errors, errors
        assert _assert_all_under(store, new) == 2
    finally:
        store.close()


@pytest.mark.postgres
def test_rotation_under_concurrent_tenant_and_key_writers(postgres_url):
    """Writers configured with the old KEK create tenants, keys and rotate keys in a loop
    while the KEK rotates: afterwards every key opens with the new KEK and none carries
    the old KEK id (writers that come after the rotation are refused, naming the KEK)."""
    old, new = Kek.generate(), Kek.generate()
    store = _open(postgres_url, old)
    writers = [_open(postgres_url, old) for _ in range(3)]
    try:
        with store.transaction() as session:
            for i in range(20):
                create_tenant(session, name=f"t{i}", actor=ACTOR)
                create_key(session, store.keyring, tenant=f"t{i}", actor=ACTOR)
            create_signing_key(session, store.keyring, actor=ACTOR)
        stop, first_write, first_refusal = threading.Event(), threading.Event(), threading.Event()
        written, refused, unexpected = [0], [0], []

        def work(index: int, writer_store) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    with writer_store.transaction() as session:
                        name = f"w{index}-{n}"
                        create_tenant(session, name=name, actor=ACTOR)
                        create_key(session, writer_store.keyring, tenant=name, actor=ACTOR)
                    with writer_store.transaction() as session:
                        rotate_key(session, writer_store.keyring, tenant=f"t{(index * 7 + n) % 20}", actor=ACTOR)
                    written[0] += 1
                    first_write.set()
                except KekError:
                    refused[0] += 1
                    first_refusal.set()
                except KeyStoreError:
                    pass  # a concurrent rotation of the same tenant won: retried next round
                except BaseException as exc:  # noqa: BLE001
                    unexpected.append(exc)

        threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(writers)]
        for thread in threads:
            thread.start()
        # Wait for the events, not a fixed delay: a busy CI box may not schedule a writer
        # within any given interval.
        assert first_write.wait(60), unexpected
        with store.transaction() as session:
            result = rotate_kek(session, current=store.keyring, new=new, actor=ACTOR, dependants=KEK_DEPENDANTS)
        assert first_refusal.wait(60), unexpected
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not unexpected, unexpected
        assert written[0] > 0 and refused[0] > 0, (written, refused)
        assert result.previous_kek_ids == (old.id,)
        assert _assert_all_under(store, new) >= 20 + written[0]
    finally:
        for opened in (store, *writers):
            opened.close()


def test_staged_rollout_previous_kek_unwraps_only(store, kek, database_url, tmp_path):
    """A gateway given the new KEK with the old one as previous serves before and after the
    rotation; it wraps only under the new one; `kek status` counts keys per KEK id."""
    with store.transaction() as session:
        create_tenant(session, name="acme", actor=ACTOR)
        create_key(session, store.keyring, tenant="acme", actor=ACTOR)
    new = Kek.generate()
    staged = load_keyring(StoreSettings(database_url=database_url, kek=SecretStr(new.to_base64()),
                                        kek_previous=SecretStr(kek.to_base64())))
    assert staged.ids == (new.id, kek.id) and staged.primary.id == new.id
    with store.transaction(write=False) as session:
        assert len(detection_keys(session, staged)) == 1  # before the rotation: opens via previous
        status = kek_status(session, staged, KEK_DEPENDANTS)
        assert status.watermark_keys == {kek.id: 1} and status.to_dict()["unopenable"] == []
    with store.transaction() as session:
        with pytest.raises(KekError, match="not the KEK"):
            create_key(session, staged, tenant="acme", actor=ACTOR)  # would split the store
    with store.transaction() as session:
        rotate_kek(session, current=staged, new=new, actor=ACTOR, dependants=KEK_DEPENDANTS)
    with store.transaction(write=False) as session:
        assert len(detection_keys(session, staged)) == 1
        assert kek_status(session, Keyring([kek]), KEK_DEPENDANTS).to_dict()["unopenable"] == [new.id]
    with store.transaction() as session:
        create_key(session, staged, tenant="acme", actor=ACTOR)  # now fine, under the new KEK
    with store.transaction() as session:
        with pytest.raises(KekError, match="not the KEK"):
            create_key(session, Keyring([kek]), tenant="acme", actor=ACTOR)  # an old-config writer
    previous_file = tmp_path / "old.kek"
    previous_file.write_text(kek.to_base64())
    previous_file.chmod(0o600)
    same = load_keyring(StoreSettings(kek=SecretStr(new.to_base64()), kek_previous_file=previous_file))
    assert same.ids == staged.ids
    with pytest.raises(KekError, match="only one"):
        load_keyring(StoreSettings(kek=SecretStr(new.to_base64()), kek_previous_file=previous_file,
                                   kek_previous=SecretStr(kek.to_base64())))


def test_cli_kek_status(cli, kek):
    cli.ok("tenants", "create", "acme")
    cli.ok("keys", "create", "--tenant", "acme")
    cli.ok("signing-keys", "create")
    status = cli.ok("kek", "status", "--json").json()
    assert status["watermark_keys"] == {kek.id: 1} and status["signing_keys"] == {kek.id: 1}
    assert status["configured"] == [kek.id]
    assert f"KEK {kek.id}: 1 watermark key(s), 1 signing key(s) (configured)" in cli.ok("kek", "status").stdout


def test_forget_kek_environment(monkeypatch):
    from keys.kek import forget_kek_environment

    monkeypatch.setenv("HALLMARK_KEK", Kek.generate().to_base64())
    monkeypatch.setenv("HALLMARK_KEK_PREVIOUS", Kek.generate().to_base64())
    settings = StoreSettings()
    forget_kek_environment()
    import os

    assert "HALLMARK_KEK" not in os.environ and "HALLMARK_KEK_PREVIOUS" not in os.environ
    assert load_keyring(settings).primary is not None  # the settings kept it


def test_forgetting_a_kek_from_the_environment_warns_that_proc_keeps_it(monkeypatch, caplog):
    """os.environ.pop cannot erase /proc/<pid>/environ: say so (without the KEK) and point
    to HALLMARK_KEK_FILE; a file-configured KEK leaves nothing to warn about."""
    from keys.kek import forget_kek_environment

    kek = Kek.generate().to_base64()
    monkeypatch.setenv("HALLMARK_KEK", kek)
    with caplog.at_level("WARNING", logger="hallmark.keys"):
        forget_kek_environment()
    assert "environ" in caplog.text and "HALLMARK_KEK_FILE" in caplog.text and kek not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hallmark.keys"):
        forget_kek_environment()
    assert caplog.text == ""
