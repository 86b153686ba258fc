"""KEK loading, ids, the keyring, and KEK files."""

from __future__ import annotations

import base64
import logging
import os
import stat

import pytest
from pydantic import SecretStr

from keys.errors import ConfigError, KekError
from keys.kek import (
    KEK_BYTES,
    Kek,
    Keyring,
    ensure_dev_kek_file,
    generate_kek_file,
    kek_id,
    load_kek,
    load_keyring,
    read_kek_file,
)
from keys.settings import StoreSettings


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_kek_from_base64_round_trips_and_has_a_stable_opaque_id():
    raw = os.urandom(KEK_BYTES)
    kek = Kek.from_base64(_b64(raw) + "\n", source="test")
    assert kek.material == raw
    assert kek.id == kek_id(raw) == Kek(raw).id
    assert len(kek.id) == 16 and int(kek.id, 16) >= 0
    assert kek.id not in raw.hex()
    assert Kek.generate().id != kek.id


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_kek_of_the_wrong_length_is_refused_naming_the_kek(length):
    with pytest.raises(KekError) as caught:
        Kek.from_base64(_b64(os.urandom(length)), source="HALLMARK_KEK")
    message = caught.value.user_message
    assert "KEK" in message and f"is {length} bytes" in message and "\n" not in message


@pytest.mark.parametrize("text", ["not base64!", "Zm9v=bar", "ä" * 44])
def test_kek_that_is_not_base64_is_refused(text):
    with pytest.raises(KekError, match="KEK"):
        Kek.from_base64(text, source="HALLMARK_KEK")


def test_secrets_stay_out_of_repr_and_dumps():
    kek = Kek.generate()
    settings = StoreSettings(database_url="sqlite:///x.db", kek=SecretStr(kek.to_base64()))
    ring = Keyring([kek])
    for shown in (repr(kek), str(kek), repr(ring), repr(settings), str(settings.model_dump()),
                  settings.model_dump_json()):
        assert kek.to_base64() not in shown
        assert kek.material.hex() not in shown
    assert "kek" not in settings.model_dump()


def test_settings_read_the_environment(monkeypatch, tmp_path):
    kek = Kek.generate()
    monkeypatch.setenv("HALLMARK_DATABASE_URL", "sqlite:///elsewhere.db")
    monkeypatch.setenv("HALLMARK_KEK", kek.to_base64())
    settings = StoreSettings()
    assert settings.database_url == "sqlite:///elsewhere.db"
    assert load_kek(settings).id == kek.id
    monkeypatch.delenv("HALLMARK_DATABASE_URL")
    monkeypatch.delenv("HALLMARK_KEK")
    assert StoreSettings().database_url == "sqlite:///./var/hallmark.db"


def test_missing_kek_is_refused():
    with pytest.raises(KekError) as caught:
        load_kek(StoreSettings(database_url="sqlite:///x.db"))
    assert "no KEK configured" in caught.value.user_message
    assert "HALLMARK_KEK" in caught.value.user_message


def test_kek_set_twice_is_refused(tmp_path):
    path = tmp_path / "kek"
    generate_kek_file(path)
    settings = StoreSettings(kek=SecretStr(Kek.generate().to_base64()), kek_file=path)
    with pytest.raises(KekError, match="both HALLMARK_KEK and HALLMARK_KEK_FILE"):
        load_keyring(settings)


def test_kek_file_loading(tmp_path):
    path = tmp_path / "kek.b64"
    written = generate_kek_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_kek(StoreSettings(kek_file=path)).id == written.id
    with pytest.raises(KekError, match="KEK file .* does not exist"):
        read_kek_file(tmp_path / "missing")
    (tmp_path / "short").write_text(_b64(os.urandom(24)))
    (tmp_path / "short").chmod(0o600)
    with pytest.raises(KekError, match="24 bytes"):
        read_kek_file(tmp_path / "short")
    (tmp_path / "binary").write_bytes(os.urandom(32) + b"\xff")
    (tmp_path / "binary").chmod(0o600)
    with pytest.raises(KekError, match="KEK"):
        read_kek_file(tmp_path / "binary")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_kek_file_others_can_read_is_refused(tmp_path, caplog, mode):
    path = tmp_path / "kek.b64"
    kek = generate_kek_file(path)
    path.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="hallmark.keys"), pytest.raises(KekError, match="chmod 600") as err:
        read_kek_file(path)
    assert kek.to_base64() not in caplog.text + str(err.value)


@pytest.mark.parametrize("material", [bytes(32), b"\xff" * 32, b"A" * 32])
def test_degenerate_keks_are_refused(material):
    with pytest.raises(KekError, match="repeated byte"):
        Kek(material)
    with pytest.raises(KekError, match="repeated byte"):
        Kek.from_base64(_b64(material), source="HALLMARK_KEK")


def test_generate_never_overwrites(tmp_path):
    path = tmp_path / "kek.b64"
    first = generate_kek_file(path)
    with pytest.raises(ConfigError, match="already exists"):
        generate_kek_file(path)
    assert read_kek_file(path).id == first.id


def test_ensure_dev_kek_file_creates_once_then_reuses(tmp_path):
    path = tmp_path / "var" / "dev" / "kek.b64"
    first = ensure_dev_kek_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(base64.b64decode(path.read_text().strip())) == KEK_BYTES
    assert ensure_dev_kek_file(path).id == first.id


def test_keyring_newest_wraps_every_listed_unwraps():
    new, old = Kek.generate(), Kek.generate()
    ring = Keyring([new, old])
    assert ring.primary is new
    assert ring.get(old.id) is old and old.id in ring
    with pytest.raises(KekError, match="KEK"):
        ring.get(Kek.generate().id)
    with pytest.raises(KekError):
        Keyring([])
    with pytest.raises(KekError, match="twice"):
        Keyring([new, Kek(new.material)])
