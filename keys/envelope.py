"""Envelope encryption of watermark secrets: AES-256-GCM under a KEK.

A secret (8 bytes big-endian for a 64-bit key, 32 for a 256-bit one:
:func:`watermark.prf.secret_bytes`) is sealed with a fresh random 96-bit nonce and
associated data that binds the row it belongs to (tenant id, key id, version) and the id
of the KEK that sealed it. A ciphertext copied into another row, a row whose version or
tenant was edited, or a flipped bit all fail to open, with one opaque error
(:class:`~keys.errors.UnwrapError`) whatever the cause.

The associated data is required (a :class:`KeyBinding`), so no caller can forget it.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass

from keys.errors import InvalidInput, UnwrapError
from keys.kek import Kek, Keyring
from watermark.prf import secret_bytes

NONCE_BYTES = 12
SECRET_BYTES = 8
WIDE_SECRET_BYTES = 32
TAG_BYTES = 16
AD_LABEL = b"hallmark/key-wrap/v1"
MAX_SECRET = 2**256 - 1

# cryptography is imported where a secret is sealed or opened: `keys list` and `keys show`
# load this module (through keys.lifecycle) without doing either, and the import is a few
# percent of their start-up.


@dataclass(frozen=True)
class KeyBinding:
    """What a wrapped secret is bound to: the row it belongs to."""

    tenant_id: str
    key_id: str
    version: int


@dataclass(frozen=True)
class WrappedSecret:
    """A sealed secret as stored: ciphertext (with its tag), nonce, and the sealing KEK's id."""

    ciphertext: bytes
    nonce: bytes
    kek_id: str


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    # Length prefixes keep ("ab", "c") and ("a", "bc") from encoding alike.
    return struct.pack(">H", len(raw)) + raw


def associated_data(binding: KeyBinding, kek_id: str) -> bytes:
    """The bytes AES-GCM authenticates beside the secret (public, canonical)."""
    return b"".join((AD_LABEL, _field(binding.tenant_id), _field(binding.key_id), _field(str(binding.version)),
                     _field(kek_id)))


def _check_secret(secret: int) -> None:
    if isinstance(secret, bool) or not isinstance(secret, int) or not 0 <= secret <= MAX_SECRET:
        raise InvalidInput("a watermark secret must be an integer in [0, 2**256 - 1]")


def wrap_secret(keyring: Keyring, *, secret: int, binding: KeyBinding) -> WrappedSecret:
    """Seal ``secret`` under the keyring's newest KEK with a fresh random nonce."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    _check_secret(secret)
    kek = keyring.primary
    nonce = secrets.token_bytes(NONCE_BYTES)
    ciphertext = AESGCM(kek.material).encrypt(
        nonce, secret_bytes(secret), associated_data(binding, kek.id)
    )
    return WrappedSecret(ciphertext=ciphertext, nonce=nonce, kek_id=kek.id)


def unwrap_secret(keyring: Keyring, *, wrapped: WrappedSecret, binding: KeyBinding) -> int:
    """Open a sealed secret.

    Raises :class:`~keys.errors.KekError` if the sealing KEK is not on the ring (a
    configuration problem, named as such) and :class:`~keys.errors.UnwrapError` for any
    ciphertext, nonce, tag or binding that does not authenticate.
    """
    from cryptography.exceptions import InvalidTag

    kek: Kek = keyring.get(wrapped.kek_id)
    if len(wrapped.nonce) != NONCE_BYTES or len(wrapped.ciphertext) not in (SECRET_BYTES + TAG_BYTES,
                                                                             WIDE_SECRET_BYTES + TAG_BYTES):
        raise UnwrapError(binding.key_id)
    try:
        plaintext = kek.aead.decrypt(
            wrapped.nonce, wrapped.ciphertext, associated_data(binding, kek.id)
        )
    except InvalidTag:
        raise UnwrapError(binding.key_id) from None
    return int.from_bytes(plaintext, "big")


def rewrap_secret(keyring: Keyring, *, wrapped: WrappedSecret, binding: KeyBinding) -> WrappedSecret:
    """Open under whichever listed KEK sealed it and seal again under the newest."""
    return wrap_secret(keyring, secret=unwrap_secret(keyring, wrapped=wrapped, binding=binding),
                       binding=binding)
