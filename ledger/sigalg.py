"""Signing-key algorithms: Ed25519, and the composite Ed25519 + ML-DSA-44 (FIPS 204) for
evidence that must outlast a quantum computer. Pure: only ``cryptography``.

A composite key is an Ed25519 key and an ML-DSA-44 key used together. Its public key, as
stored, logged (ledger.log.leaves.key_event) and served in the key set, is the 32 raw Ed25519
bytes followed by the 1312-byte ML-DSA-44 public key; its id (ledger.receipts.key_id_of) hashes
all 1344 bytes, so the id binds both halves. The private key is the two 32-byte seeds, sealed
together under the KEK (ledger.signing). A composite signature carries ``sig`` (Ed25519) and
``ml_dsa_44_sig`` (ML-DSA-44, empty context), both over the same signed bytes, and verifies
only when BOTH do: which signatures are required comes from the key's logged algorithm, never
from the document's own ``alg``, so stripping the ML-DSA-44 signature (and relabelling the
document ``Ed25519``) fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import mldsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519 = "Ed25519"
COMPOSITE = "Ed25519+ML-DSA-44"
ALGORITHMS = (ED25519, COMPOSITE)
CLI_NAMES = {"ed25519": ED25519, "ed25519+ml-dsa-44": COMPOSITE}
"""``hallmark signing-keys create|rotate --alg`` -> the algorithm's name in keys and signatures."""
ML_DSA_SIG_FIELD = "ml_dsa_44_sig"
_ED_PUBLIC, _ML_PUBLIC, _SEED = 32, 1312, 32
_PUBLIC_SIZE = {ED25519: _ED_PUBLIC, COMPOSITE: _ED_PUBLIC + _ML_PUBLIC}


class BadSignature(ValueError):
    """A signature does not verify under a key; the message is the one-line reason."""


def alg_of_public(raw: bytes) -> str:
    """The algorithm of a stored public key, by its length (32: Ed25519; 1344: composite)."""
    for alg, size in _PUBLIC_SIZE.items():
        if len(raw) == size:
            return alg
    raise ValueError(f"a signing public key of {len(raw)} bytes is of no known algorithm")


@dataclass(frozen=True)
class PublicKey:
    """A verifying key of either algorithm (``ml_dsa`` None for Ed25519)."""

    alg: str
    ed25519: Ed25519PublicKey
    ml_dsa: Any = None

    @classmethod
    def load(cls, alg: str, raw: bytes) -> "PublicKey":
        """``raw`` as stored/logged for ``alg``; ValueError on a wrong length or algorithm."""
        if alg not in _PUBLIC_SIZE or len(raw) != _PUBLIC_SIZE[alg]:
            raise ValueError(f"not a {alg} public key")
        ml = mldsa.MLDSA44PublicKey.from_public_bytes(raw[_ED_PUBLIC:]) if alg == COMPOSITE else None
        return cls(alg, Ed25519PublicKey.from_public_bytes(raw[:_ED_PUBLIC]), ml)

    def check(self, signature: dict[str, Any], data: bytes, decode) -> None:
        """:class:`BadSignature` unless ``signature`` (its ``alg`` this key's, and every signature
        this key's algorithm needs, decoded with ``decode``) verifies ``data``."""
        if signature.get("alg") != self.alg:
            need = "both an Ed25519 and an ML-DSA-44 signature" if self.alg == COMPOSITE else "an Ed25519 signature"
            raise BadSignature(f"the signature is {signature.get('alg')!r} but its key is {self.alg}, which "
                               f"requires {need}")
        fields = [("sig", self.ed25519)] + ([(ML_DSA_SIG_FIELD, self.ml_dsa)] if self.ml_dsa is not None else [])
        for field, key in fields:
            try:
                raw = decode(signature.get(field))
            except (ValueError, TypeError):
                raise BadSignature(f"the signature's {field} is missing or not base64url") from None
            try:
                key.verify(raw, data)
            except (InvalidSignature, ValueError):
                what = "ML-DSA-44" if field == ML_DSA_SIG_FIELD else "Ed25519"
                raise BadSignature(f"bad {what} signature") from None


@dataclass(frozen=True)
class PrivateKey:
    """An opened signing key of either algorithm. Never in ``repr``."""

    ed25519: Ed25519PrivateKey
    ml_dsa: Any = None

    def __repr__(self) -> str:
        return f"PrivateKey(alg={self.alg!r})"

    @property
    def alg(self) -> str:
        return COMPOSITE if self.ml_dsa is not None else ED25519

    @classmethod
    def generate(cls, alg: str) -> "PrivateKey":
        if alg not in ALGORITHMS:
            raise ValueError(f"unknown signing algorithm {alg!r}")
        return cls(Ed25519PrivateKey.generate(), mldsa.MLDSA44PrivateKey.generate() if alg == COMPOSITE else None)

    @classmethod
    def from_seeds(cls, raw: bytes) -> "PrivateKey":
        """From :meth:`seeds` (32 bytes: Ed25519; 64: composite); ValueError otherwise."""
        if len(raw) not in (_SEED, 2 * _SEED):
            raise ValueError("not a signing key's seeds")
        ml = mldsa.MLDSA44PrivateKey.from_seed_bytes(raw[_SEED:]) if len(raw) == 2 * _SEED else None
        return cls(Ed25519PrivateKey.from_private_bytes(raw[:_SEED]), ml)

    def seeds(self) -> bytes:
        return self.ed25519.private_bytes_raw() + (self.ml_dsa.private_bytes_raw() if self.ml_dsa else b"")

    def public_raw(self) -> bytes:
        raw = self.ed25519.public_key().public_bytes_raw()
        return raw + (self.ml_dsa.public_key().public_bytes_raw() if self.ml_dsa else b"")

    def sign(self, data: bytes, encode) -> dict[str, Any]:
        """The signature fields (``alg``, ``sig`` and, composite, ``ml_dsa_44_sig``), encoded with ``encode``."""
        fields = {"alg": self.alg, "sig": encode(self.ed25519.sign(data))}
        if self.ml_dsa is not None:
            fields[ML_DSA_SIG_FIELD] = encode(self.ml_dsa.sign(data))
        return fields
