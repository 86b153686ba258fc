"""C2SP signed notes (c2sp.org/signed-note) and transparency-log checkpoints
(c2sp.org/tlog-checkpoint), Ed25519 only: pure functions, no I/O.

A checkpoint is the note text::

    <origin>\\n<tree size>\\n<base64 root hash>\\nTimestamp: <unix nanoseconds>\\n

a blank line, and one signature line per key, ``— <key name> base64(key ID || signature)``,
where the key ID is ``SHA-256(key name || 0x0A || 0x01 || public key)[:4]`` and the Ed25519
signature covers the note text (final newline included). The timestamp is an extension
line (as Rekor's checkpoints carry one): when the log signed this size. A verifier key (what
a verifier pins, ``--trust-log-key``) is ``<name>+<hex key ID>+<base64(0x01 || public key)>``.
Verification ignores signatures by other keys (witness cosignatures may ride along) and
needs one good signature by the pinned key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ED25519 = 0x01
MAX_SIGNATURES = 100
_NAME = re.compile(r"[^\s+]+")
_SIGNATURE = re.compile(r"\u2014 (\S+) (\S+)")


class NoteError(ValueError):
    """A note or checkpoint does not parse or verify; the message is the one-line reason."""


def key_id(name: str, public_raw: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ED25519]) + public_raw).digest()[:4]


@dataclass(frozen=True)
class Verifier:
    """A pinned Ed25519 note key: its name and public key."""

    name: str
    public_raw: bytes

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.public_raw)

    @property
    def vkey(self) -> str:
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(bytes([ED25519]) + self.public_raw).decode()}"

    @classmethod
    def parse(cls, text: str) -> "Verifier":
        """From the ``name+hexid+base64`` encoding; :class:`NoteError` if malformed."""
        parts = text.strip().split("+", 2)  # the base64 key may itself hold '+'; names may not
        if len(parts) != 3 or not _NAME.fullmatch(parts[0]):
            raise NoteError("not a verifier key (expected name+hex key id+base64 key)")
        try:
            raw = base64.b64decode(parts[2], validate=True)
            wanted = bytes.fromhex(parts[1])
        except (binascii.Error, ValueError):
            raise NoteError("not a verifier key: its key id or key is not hex/base64") from None
        if len(raw) != 33 or raw[0] != ED25519:
            raise NoteError("not an Ed25519 verifier key")
        verifier = cls(parts[0], raw[1:])
        if verifier.key_id != wanted:
            raise NoteError("the verifier key's id does not match its name and key")
        return verifier

    def verify(self, text: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public_raw).verify(signature, text)
            return True
        except (InvalidSignature, ValueError):
            return False


@dataclass(frozen=True)
class NoteSigner:
    name: str
    private_key: Ed25519PrivateKey

    def __repr__(self) -> str:
        return f"NoteSigner(name={self.name!r})"

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def sign(self, text: str) -> str:
        """The signed note of ``text`` (which must end in a newline)."""
        _check_text(text)
        body = text.encode("utf-8")
        signature = base64.b64encode(self.verifier.key_id + self.private_key.sign(body)).decode()
        return f"{text}\n\u2014 {self.name} {signature}\n"


def _check_text(text: str) -> None:
    if not text.endswith("\n") or any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("a note's text ends in a newline and holds no control characters")


def open_note(note: str, verifier: Verifier) -> str:
    """The text of ``note`` if it carries a good signature by ``verifier``; :class:`NoteError`
    otherwise (also when a signature by that key fails)."""
    if not isinstance(note, str):
        raise NoteError("the note is not text")
    split = note.rfind("\n\n")
    if split < 0 or not note.endswith("\n"):
        raise NoteError("not a signed note (no blank line before the signatures)")
    text, lines = note[:split + 1], note[split + 2:].splitlines()
    _check_text(text)
    if not lines or len(lines) > MAX_SIGNATURES:
        raise NoteError("a signed note carries 1 to 100 signatures")
    good = False
    for line in lines:
        match = _SIGNATURE.fullmatch(line)
        if match is None:
            raise NoteError("a signature line of the note is malformed")
        try:
            raw = base64.b64decode(match.group(2), validate=True)
        except binascii.Error:
            raise NoteError("a note signature is not base64") from None
        if len(raw) < 5:
            raise NoteError("a note signature is too short")
        if match.group(1) != verifier.name or raw[:4] != verifier.key_id:
            continue  # another key's (a witness's cosignature): ignored
        if not verifier.verify(text.encode("utf-8"), raw[4:]):
            raise NoteError(f"bad signature by {verifier.name}: the checkpoint was altered or not signed by the log key")
        good = True
    if not good:
        raise NoteError(f"the note carries no signature by the log key {verifier.name}+{verifier.key_id.hex()}")
    return text


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    timestamp_ns: int

    def text(self) -> str:
        return (f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"
                f"Timestamp: {self.timestamp_ns}\n")

    @classmethod
    def parse_text(cls, text: str) -> "Checkpoint":
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or any(line == "" for line in lines[:-1]):
            raise NoteError("a checkpoint is origin, size and root hash, one a line")
        origin, size, root = lines[0], lines[1], lines[2]
        if not re.fullmatch(r"0|[1-9][0-9]{0,18}", size):
            raise NoteError("the checkpoint's tree size is not a decimal number")
        try:
            root_raw = base64.b64decode(root, validate=True)
        except binascii.Error:
            raise NoteError("the checkpoint's root hash is not base64") from None
        if len(root_raw) != 32:
            raise NoteError("the checkpoint's root hash is not 32 bytes")
        timestamp = 0
        for extension in lines[3:-1]:
            if extension.startswith("Timestamp: ") and extension[11:].isdigit():
                timestamp = int(extension[11:])
        return cls(origin, int(size), root_raw, timestamp)


def open_checkpoint(note: str, verifier: Verifier) -> Checkpoint:
    """A checkpoint whose note verifies under ``verifier`` and whose origin is its key name."""
    checkpoint = Checkpoint.parse_text(open_note(note, verifier))
    if checkpoint.origin != verifier.name:
        raise NoteError(f"the checkpoint is from log {checkpoint.origin!r}, not {verifier.name!r}")
    return checkpoint
