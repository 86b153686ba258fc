"""The plugin keyring: how a remote ``vllm serve`` resolves a key id to its secret.

A remote vLLM server must never receive key material in a request body (a client
controls that body). Instead Hallmark writes the keys the server may use to a local file
(``hallmark deploy keyring --out FILE``), readable by its owner only, and starts
``vllm serve`` with ``HALLMARK_VLLM_KEYRING=FILE``; the gateway then sends only a key id.
The plugin re-reads the file when it changes (a rotation adds the new key), so the
server need not restart. Format (JSON)::

    {"format": "hallmark-vllm-keyring/v1",
     "keys": {"<key id>": {"secret": "0x<16 hex>", "spec": {...}, "tenant": "...",
                            "version": 1, "fingerprint": "<6 hex>"}}}

Each entry's fingerprint is checked against its secret when the file is read, so a
misfiled secret is refused. Nothing here prints or logs a secret.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from pydantic import ValidationError

from watermark import prf
from watermark.key import WatermarkKey, check_value, fingerprint
from watermark.spec import WatermarkSpec

KEYRING_ENV = "HALLMARK_VLLM_KEYRING"
FORMAT = "hallmark-vllm-keyring/v1"


class KeyringError(ValueError):
    """The keyring file is missing, unsafe or malformed, or lacks a key id."""


@dataclass(frozen=True)
class KeyringEntry:
    key_id: str
    tenant: str
    version: int
    fingerprint: str
    key: WatermarkKey = field(repr=False)
    state: str = "active"
    """The key's state when the keyring was written: the plugin generates with active keys only."""


def check_private(path: Path) -> None:
    """Refuse a key file that its group or others can read or write (like ssh does)."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeyringError(f"{path} is accessible by group or others (mode {mode:o}); "
                           f"run `chmod 600 {path}`")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (no window in which a
    wider umask exposes it), replacing any previous file atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)  # O_CREAT's mode is filtered by the umask
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def render(entries: Iterable[KeyringEntry]) -> str:
    """The keyring file's text for ``entries``."""
    keys = {}
    for entry in entries:
        keys[entry.key_id] = {"secret": f"0x{entry.key.secret:0{entry.key.spec.key_bits // 4}x}", "spec": entry.key.spec.public_dict(),
                              "tenant": entry.tenant, "version": entry.version,
                              "fingerprint": entry.fingerprint, "state": entry.state}
    return json.dumps({"format": FORMAT, "keys": keys}, indent=2) + "\n"


def write_keyring(path: Path | str, entries: Iterable[KeyringEntry]) -> Path:
    path = Path(path)
    write_private(path, render(entries))
    return path


def _parse_entry(key_id: str, raw: object, path: Path) -> KeyringEntry:
    if not isinstance(raw, dict):
        raise KeyringError(f"entry {key_id!r} of {path} is not an object")
    try:
        secret_text = raw["secret"]
        secret = int(secret_text, 0) if isinstance(secret_text, str) else int(secret_text)
        spec = WatermarkSpec.model_validate(raw["spec"])
        prf.check_key(secret, spec.key_bits)
        tenant, version, printed = str(raw["tenant"]), int(raw["version"]), str(raw["fingerprint"])
        state = str(raw.get("state", "active"))  # files written before states were kept
    except (KeyError, TypeError, ValueError, ValidationError):
        # Never repeat the offending value: it may be the secret.
        raise KeyringError(f"entry {key_id!r} of {path} is malformed; rewrite the file with "
                           "`hallmark deploy keyring`") from None
    # Files written before fingerprints were cut to 24 bits hold the 64-bit check value.
    if printed not in (fingerprint(secret), check_value(secret)):
        raise KeyringError(f"entry {key_id!r} of {path}: the secret does not match its fingerprint")
    return KeyringEntry(key_id=key_id, tenant=tenant, version=version, fingerprint=fingerprint(secret),
                        key=WatermarkKey(secret=secret, spec=spec), state=state)


def read_keyring(path: Path | str) -> dict[str, KeyringEntry]:
    path = Path(path)
    try:
        check_private(path)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KeyringError(f"the keyring file {path} ({KEYRING_ENV}) does not exist; write it "
                           "with `hallmark deploy keyring --out FILE`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyringError(f"cannot read the keyring file {path}: "
                           f"{getattr(exc, 'strerror', None) or 'not UTF-8'}") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise KeyringError(f"the keyring file {path} is not JSON") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("keys"), dict):
        raise KeyringError(f"the keyring file {path} is not a {FORMAT} file")
    return {key_id: _parse_entry(key_id, raw, path) for key_id, raw in data["keys"].items()}


class Keyring:
    """A keyring file, re-read whenever it is replaced or modified."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._entries: dict[str, KeyringEntry] = {}

    def __repr__(self) -> str:
        return f"Keyring(path={str(self.path)!r})"

    def lookup(self, key_id: str) -> KeyringEntry:
        with self._lock:
            try:
                info = self.path.stat()
            except FileNotFoundError:
                raise KeyringError(f"the keyring file {self.path} ({KEYRING_ENV}) does not exist; "
                                   "write it with `hallmark deploy keyring --out FILE`") from None
            # A rewrite replaces the file (new inode), so this sees every change.
            stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
            if stamp != self._stamp:
                self._entries = read_keyring(self.path)
                self._stamp = stamp
            entry = self._entries.get(key_id)
        if entry is None:
            raise KeyringError(f"key {key_id!r} is not in this vLLM server's keyring {self.path}; "
                               "rewrite it with `hallmark deploy keyring` after creating or "
                               "rotating keys")
        if entry.state != "active":
            raise KeyringError(f"key {key_id!r} is {entry.state}: this vLLM server generates only with "
                               "active keys")
        return entry


_SHARED: dict[str, Keyring] = {}
_SHARED_LOCK = threading.Lock()


def keyring_from_env() -> Keyring | None:
    """The process-wide keyring named by ``HALLMARK_VLLM_KEYRING``, or None."""
    path = os.environ.get(KEYRING_ENV)
    if not path:
        return None
    with _SHARED_LOCK:
        if path not in _SHARED:
            _SHARED[path] = Keyring(path)
        return _SHARED[path]
