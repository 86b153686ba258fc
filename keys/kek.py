"""Key-encryption keys (KEKs) and the keyring that holds them.

A KEK is 32 random bytes that wraps every watermark secret (see :mod:`keys.envelope`).
It comes from configuration, never from the database: ``HALLMARK_KEK`` (base64) or
``HALLMARK_KEK_FILE`` (a file holding that base64 text). Its id, stored beside each
wrapped secret, is a truncated SHA-256 of a fixed label and the KEK: it tells which KEK
opens a row and reveals nothing of the KEK.

A :class:`Keyring` lists KEKs newest first: the newest wraps, every listed one unwraps.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from keys.errors import ConfigError, KekError
from keys.settings import DEFAULT_DATABASE_URL, DEV_KEK_FILE, StoreSettings

log = logging.getLogger("hallmark.keys")

KEK_BYTES = 32
KEK_ID_LABEL = b"hallmark/kek-id/v1\x00"
KEK_ID_HEX_DIGITS = 16
_HOW_TO_MAKE_ONE = "`hallmark kek generate --out FILE` makes one"


def kek_id(material: bytes) -> str:
    """16 hex digits of SHA-256(label || KEK): names a KEK without revealing it."""
    return hashlib.sha256(KEK_ID_LABEL + material).hexdigest()[:KEK_ID_HEX_DIGITS]


@dataclass(frozen=True)
class Kek:
    """One key-encryption key. ``material`` never appears in ``repr``."""

    material: bytes = field(repr=False)
    source: str = "generated"
    """Where it came from (``HALLMARK_KEK``, ``file /path``), for error messages."""

    def __post_init__(self) -> None:
        if not isinstance(self.material, bytes) or len(self.material) != KEK_BYTES:
            length = len(self.material) if isinstance(self.material, (bytes, bytearray)) else 0
            raise KekError(
                f"the KEK from {self.source} is {length} bytes long; a KEK must be exactly "
                f"{KEK_BYTES} bytes, base64-encoded ({_HOW_TO_MAKE_ONE})"
            )
        if len(set(self.material)) == 1:
            # All zero or one repeated byte: a placeholder, not a key.
            raise KekError(f"the KEK from {self.source} is one repeated byte, not a random key "
                           f"({_HOW_TO_MAKE_ONE})")

    @functools.cached_property
    def id(self) -> str:
        return kek_id(self.material)

    @functools.cached_property
    def aead(self):
        """AES-256-GCM under this KEK (cryptography's ``AESGCM``), made once: opening many
        secrets (a detection over every key of a store) then skips its key setup."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        return AESGCM(self.material)

    @classmethod
    def generate(cls) -> "Kek":
        return cls(secrets.token_bytes(KEK_BYTES), source="generated")

    @classmethod
    def from_base64(cls, text: str, *, source: str) -> "Kek":
        """Decode base64 text (surrounding whitespace ignored); refuse anything but 32 bytes."""
        try:
            material = base64.b64decode(text.strip().encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise KekError(
                f"the KEK from {source} is not valid base64; it must be base64 of exactly "
                f"{KEK_BYTES} bytes ({_HOW_TO_MAKE_ONE})"
            ) from None
        return cls(material, source=source)

    def to_base64(self) -> str:
        return base64.b64encode(self.material).decode("ascii")


class Keyring:
    """KEKs newest first: :attr:`primary` wraps, :meth:`get` finds any listed one by id."""

    __slots__ = ("_keks",)

    def __init__(self, keks: Iterable[Kek]) -> None:
        listed = tuple(keks)
        if not listed:
            raise KekError(f"a keyring needs at least one KEK ({_HOW_TO_MAKE_ONE})")
        ids = [k.id for k in listed]
        if len(set(ids)) != len(ids):
            raise KekError("the same KEK is listed twice; list each KEK once")
        self._keks = listed

    @property
    def primary(self) -> Kek:
        return self._keks[0]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(k.id for k in self._keks)

    def __contains__(self, kek_id_: object) -> bool:
        return kek_id_ in self.ids

    def get(self, kek_id_: str) -> Kek:
        """The KEK with this id; :class:`KekError` if it is not on the ring."""
        for kek in self._keks:
            if kek.id == kek_id_:
                return kek
        raise KekError(
            f"the configured KEK (id {self.primary.id}) cannot open keys wrapped with KEK id "
            f"{kek_id_}; set HALLMARK_KEK or HALLMARK_KEK_FILE to the KEK this store uses"
        )

    def __repr__(self) -> str:
        return f"Keyring(ids={list(self.ids)!r})"


def read_kek_file(path: Path | str) -> Kek:
    """Load a KEK file (base64 text). Refuse one that group or others can access: they
    could open every key (the vLLM plugin's keyring file is refused the same way)."""
    path = Path(path)
    source = f"file {path}"
    try:
        text = path.read_text(encoding="ascii")
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise KekError(f"the KEK file {path} does not exist; check HALLMARK_KEK_FILE "
                       f"({_HOW_TO_MAKE_ONE})") from None
    except UnicodeDecodeError:
        raise KekError(f"the KEK file {path} is not base64 text; it must hold base64 of "
                       f"exactly {KEK_BYTES} bytes ({_HOW_TO_MAKE_ONE})") from None
    except OSError as exc:
        raise KekError(f"cannot read the KEK file {path}: {exc.strerror}; "
                       "check its path and permissions") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KekError(f"the KEK file {path} is accessible to group or others; `chmod 600 {path}` "
                       "(and check who could have read it)")
    return Kek.from_base64(text, source=source)


def _configured_kek(value: SecretStr | None, file: Path | None, name: str) -> Kek | None:
    """The KEK from ``name`` (base64) or ``name``_FILE, or None; both set is a :class:`KekError`."""
    if value is not None and file is not None:
        raise KekError(f"both {name} and {name}_FILE are set; set only one")
    if value is not None:
        return Kek.from_base64(value.get_secret_value(), source=name)
    if file is not None:
        return read_kek_file(file)
    return None


def load_kek(settings: StoreSettings) -> Kek:
    """The configured KEK; :class:`KekError` when it is missing, doubly set or malformed."""
    kek = _configured_kek(settings.kek, settings.kek_file, "HALLMARK_KEK")
    if kek is not None:
        return kek
    if settings.database_url == DEFAULT_DATABASE_URL and DEV_KEK_FILE.exists():
        # Development defaults go together: ./var/hallmark.db is wrapped under ./var/kek.key.
        return read_kek_file(DEV_KEK_FILE)
    raise KekError(
        "no KEK configured: set HALLMARK_KEK_FILE to the KEK file the server uses (`make run` "
        f"writes {DEV_KEK_FILE} in the directory it runs in, and the CLI finds it when run from "
        "there) or HALLMARK_KEK (base64 of 32 random bytes); a newly generated KEK opens none "
        f"of the existing keys (for a new store, {_HOW_TO_MAKE_ONE})"
    )


def load_previous_kek(settings: StoreSettings) -> Kek | None:
    """The unwrap-only previous KEK of a staged rollout (``HALLMARK_KEK_PREVIOUS`` or
    ``HALLMARK_KEK_PREVIOUS_FILE``), or None."""
    return _configured_kek(settings.kek_previous, settings.kek_previous_file, "HALLMARK_KEK_PREVIOUS")


def load_keyring(settings: StoreSettings) -> Keyring:
    """The configured KEK (wraps and unwraps) and, during a staged rollout, the previous
    KEK (unwraps only): gateways given the new KEK with the old one as previous keep
    serving before and after ``hallmark kek rotate``."""
    primary = load_kek(settings)
    previous = load_previous_kek(settings)
    if previous is None or previous.id == primary.id:
        return Keyring([primary])
    return Keyring([primary, previous])


KEK_ENVIRONMENT = ("HALLMARK_KEK", "HALLMARK_KEK_PREVIOUS")


def forget_kek_environment() -> None:
    """Remove the KEK variables from this process's environment once the settings hold
    them, so no child process inherits them and no later code reads them there.

    Limitation: this cannot erase the copy the kernel keeps. ``/proc/<pid>/environ`` shows
    the environment the process was started with for its whole life, to the same user and
    root (and to anything that can ptrace it). Only a KEK that was never in the environment
    is safe from that: prefer ``HALLMARK_KEK_FILE`` (mode 0600, refused otherwise), which
    puts only the file's path there."""
    inherited = [name for name in KEK_ENVIRONMENT if os.environ.get(name)]
    for name in KEK_ENVIRONMENT:
        os.environ.pop(name, None)
    if inherited:
        log.warning("%s removed from the environment, but the copy in /proc/%d/environ stays readable to "
                    "this user and root while the process runs; use HALLMARK_KEK_FILE instead",
                    " and ".join(inherited), os.getpid())


def _write_new_kek_file(path: Path, kek: Kek) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # O_EXCL: never overwrite a KEK, which would orphan every key wrapped under it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(kek.to_base64() + "\n")


def generate_kek_file(path: Path | str) -> Kek:
    """Write a new random KEK to ``path`` (mode 0600); refuse to overwrite an existing file."""
    path = Path(path)
    kek = Kek.generate()
    try:
        _write_new_kek_file(path, kek)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; a KEK file is never overwritten, "
                          "choose a new path") from None
    except OSError as exc:
        raise ConfigError(f"cannot write the KEK file {path}: {exc.strerror}") from None
    return Kek(kek.material, source=f"file {path}")


def ensure_dev_kek_file(path: Path | str) -> Kek:
    """Development quick-start: the KEK in ``path``, created (random, 0600) if missing."""
    path = Path(path)
    if not path.exists():
        try:
            _write_new_kek_file(path, Kek.generate())
        except FileExistsError:
            pass  # another process created it first: use theirs
        except OSError as exc:
            raise ConfigError(f"cannot write the KEK file {path}: {exc.strerror}") from None
    return read_kek_file(path)
