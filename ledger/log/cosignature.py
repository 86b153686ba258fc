"""Witness cosignatures on checkpoints (c2sp.org/tlog-cosignature): v1.0.1's timestamped
Ed25519 (signature type 0x04) and v1.1.0-rc.1's ML-DSA-44 (type 0x06). Pure functions.

A cosignature is a note signature line ``— <name> base64(key ID || timestamp || signature)``
with an 8-byte big-endian timestamp (POSIX seconds). What is signed:

- Ed25519: ``cosignature/v1\\ntime <timestamp>\\n`` followed by the checkpoint's note text
  (extension lines included, signatures not);
- ML-DSA-44: the ``cosigned_message`` structure: the 12-byte label ``subtree/v1\\n\\0``, the
  cosigner name and the log origin each with a one-byte length, the timestamp, start (0
  for a checkpoint) and end (its size) as uint64, and the root hash. It commits to the
  cosigner's name; extension lines are not covered.

A cosigner key is written as a vkey (c2sp.org/signed-note): ``<name>+<hex key ID>+
base64(type || public key)``, key ID ``SHA-256(name || 0x0A || type || public key)[:4]``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import mldsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger.log.note import Checkpoint, NoteError

ED25519_COSIGNATURE = 0x04
MLDSA44_COSIGNATURE = 0x06
ALGORITHMS = {"ed25519": ED25519_COSIGNATURE, "ml-dsa-44": MLDSA44_COSIGNATURE}
_SIZES = {ED25519_COSIGNATURE: (32, 64), MLDSA44_COSIGNATURE: (1312, 2420)}
_LABEL = b"subtree/v1\n\x00"
_SIGNATURE = re.compile(r"\u2014 (\S+) (\S+)")
_NAME = re.compile(r"[^\s+]+")

PrivateKey = Union[Ed25519PrivateKey, mldsa.MLDSA44PrivateKey]


def _key_id(name: str, kind: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([kind]) + public).digest()[:4]


def signed_message(kind: int, name: str, text: str, timestamp: int) -> bytes:
    """The bytes a cosigner of ``kind`` signs over the checkpoint note text ``text``."""
    if kind == ED25519_COSIGNATURE:
        return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode("utf-8")
    checkpoint = Checkpoint.parse_text(text)
    origin, cosigner = checkpoint.origin.encode("utf-8"), name.encode("utf-8")
    if not 1 <= len(origin) <= 255 or not 1 <= len(cosigner) <= 255:
        raise NoteError("a cosigned name or origin is 1 to 255 bytes")
    return (_LABEL + bytes([len(cosigner)]) + cosigner + struct.pack(">Q", timestamp) + bytes([len(origin)]) + origin
            + struct.pack(">QQ", 0, checkpoint.size) + checkpoint.root)


@dataclass(frozen=True)
class CosignerKey:
    """A witness's public key as a verifier pins it: its name, type (0x04 or 0x06) and key."""

    name: str
    kind: int
    public_raw: bytes

    @property
    def key_id(self) -> bytes:
        return _key_id(self.name, self.kind, self.public_raw)

    @property
    def algorithm(self) -> str:
        return "ed25519" if self.kind == ED25519_COSIGNATURE else "ml-dsa-44"

    @property
    def vkey(self) -> str:
        body = base64.b64encode(bytes([self.kind]) + self.public_raw).decode()
        return f"{self.name}+{self.key_id.hex()}+{body}"

    @classmethod
    def parse(cls, text: str) -> "CosignerKey":
        parts = text.strip().split("+", 2)
        if len(parts) != 3 or not _NAME.fullmatch(parts[0]):
            raise NoteError("not a witness key (expected name+hex key id+base64 key)")
        try:
            raw = base64.b64decode(parts[2], validate=True)
            wanted = bytes.fromhex(parts[1])
        except (binascii.Error, ValueError):
            raise NoteError("not a witness key: its key id or key is not hex/base64") from None
        if not raw or raw[0] not in _SIZES or len(raw) - 1 != _SIZES[raw[0]][0]:
            raise NoteError("not a cosignature key (type 0x04 Ed25519 or 0x06 ML-DSA-44)")
        key = cls(parts[0], raw[0], raw[1:])
        if key.key_id != wanted:
            raise NoteError("the witness key's id does not match its name and key")
        return key

    def verify(self, text: str, signature: bytes) -> int | None:
        """The timestamp of a good cosignature (key ID stripped) of note text ``text``, or None."""
        size = _SIZES[self.kind][1]
        if len(signature) != 8 + size:
            return None
        (timestamp,) = struct.unpack(">Q", signature[:8])
        if timestamp >= 1 << 63:
            return None
        try:
            message = signed_message(self.kind, self.name, text, timestamp)
            if self.kind == ED25519_COSIGNATURE:
                Ed25519PublicKey.from_public_bytes(self.public_raw).verify(signature[8:], message)
            else:
                mldsa.MLDSA44PublicKey.from_public_bytes(self.public_raw).verify(signature[8:], message)
        except (InvalidSignature, ValueError, NoteError):
            return None
        return timestamp


@dataclass(frozen=True)
class Cosigner:
    """A witness's signing key."""

    name: str
    private_key: PrivateKey

    def __repr__(self) -> str:
        return f"Cosigner(name={self.name!r}, algorithm={self.key.algorithm!r})"

    @property
    def key(self) -> CosignerKey:
        if isinstance(self.private_key, Ed25519PrivateKey):
            from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

            public = self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            return CosignerKey(self.name, ED25519_COSIGNATURE, public)
        return CosignerKey(self.name, MLDSA44_COSIGNATURE, self.private_key.public_key().public_bytes_raw())

    def cosign(self, text: str, timestamp: int) -> str:
        """The cosignature line (newline-terminated) of checkpoint note text ``text``."""
        if not 0 < timestamp < 1 << 63:
            raise ValueError("a cosignature's timestamp is positive and below 2**63")
        key = self.key
        signature = self.private_key.sign(signed_message(key.kind, self.name, text, timestamp))
        blob = base64.b64encode(key.key_id + struct.pack(">Q", timestamp) + signature).decode()
        return f"\u2014 {self.name} {blob}\n"


def generate(name: str, algorithm: str = "ml-dsa-44") -> Cosigner:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown cosignature algorithm {algorithm!r} (ed25519 or ml-dsa-44)")
    key = Ed25519PrivateKey.generate() if algorithm == "ed25519" else mldsa.MLDSA44PrivateKey.generate()
    return Cosigner(name, key)


def private_seed(cosigner: Cosigner) -> tuple[str, bytes]:
    """(algorithm, 32-byte seed) to store the key (both types' private keys are 32-byte seeds)."""
    return cosigner.key.algorithm, cosigner.private_key.private_bytes_raw()


def from_seed(name: str, algorithm: str, seed: bytes) -> Cosigner:
    if algorithm == "ed25519":
        return Cosigner(name, Ed25519PrivateKey.from_private_bytes(seed))
    if algorithm == "ml-dsa-44":
        return Cosigner(name, mldsa.MLDSA44PrivateKey.from_seed_bytes(seed))
    raise ValueError(f"unknown cosignature algorithm {algorithm!r}")


def signature_lines(block: str) -> list[tuple[str, bytes]]:
    """(name, decoded signature) of each signature line in ``block``; NoteError if malformed."""
    out = []
    for line in block.splitlines():
        match = _SIGNATURE.fullmatch(line)
        if match is None:
            raise NoteError("a signature line is malformed")
        try:
            out.append((match.group(1), base64.b64decode(match.group(2), validate=True)))
        except binascii.Error:
            raise NoteError("a signature is not base64") from None
    return out


def cosigned_by(note: str, keys: list[CosignerKey]) -> dict[CosignerKey, int]:
    """Of ``keys``, those whose good cosignature ``note`` carries, with its timestamp.
    Signatures by other keys are ignored; one that names a known key but fails does not count."""
    split = note.rfind("\n\n")
    if split < 0:
        raise NoteError("not a signed note")
    text = note[:split + 1]
    by_id = {(k.name, k.key_id): k for k in keys}
    out = {}
    for name, raw in signature_lines(note[split + 2:]):
        key = by_id.get((name, raw[:4]))
        if key is None:
            continue
        timestamp = key.verify(text, raw[4:])
        if timestamp is not None:
            out[key] = timestamp
    return out
