"""AES-256-GCM envelope: round trips, fresh nonces, tampering, associated data."""

from __future__ import annotations

import secrets

import pytest

from keys.envelope import (
    NONCE_BYTES,
    KeyBinding,
    WrappedSecret,
    associated_data,
    rewrap_secret,
    unwrap_secret,
    wrap_secret,
)
from keys.errors import InvalidInput, KekError, UnwrapError
from keys.kek import Kek, Keyring

BINDING = KeyBinding(tenant_id="ten_1", key_id="key_1", version=3)


@pytest.fixture
def ring() -> Keyring:
    return Keyring([Kek.generate()])


@pytest.mark.parametrize("secret", [0, 1, 2**32, 2**63, 2**64 - 1, secrets.randbits(64)])
def test_round_trip(ring, secret):
    wrapped = wrap_secret(ring, secret=secret, binding=BINDING)
    assert len(wrapped.nonce) == NONCE_BYTES and len(wrapped.ciphertext) == 8 + 16
    assert wrapped.kek_id == ring.primary.id
    assert unwrap_secret(ring, wrapped=wrapped, binding=BINDING) == secret


def test_every_wrap_uses_a_fresh_nonce(ring):
    secret = secrets.randbits(64)
    wraps = [wrap_secret(ring, secret=secret, binding=BINDING) for _ in range(50)]
    assert len({w.nonce for w in wraps}) == 50
    assert len({w.ciphertext for w in wraps}) == 50


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1:]


def test_any_flipped_bit_fails_with_one_opaque_error(ring):
    secret = secrets.randbits(64)
    wrapped = wrap_secret(ring, secret=secret, binding=BINDING)
    tampered = [WrappedSecret(_flip(wrapped.ciphertext, i), wrapped.nonce, wrapped.kek_id)
                for i in range(len(wrapped.ciphertext))]
    tampered += [WrappedSecret(wrapped.ciphertext, _flip(wrapped.nonce, i), wrapped.kek_id)
                 for i in range(NONCE_BYTES)]
    tampered += [WrappedSecret(wrapped.ciphertext[:-1], wrapped.nonce, wrapped.kek_id),
                 WrappedSecret(wrapped.ciphertext, wrapped.nonce[:-1], wrapped.kek_id),
                 WrappedSecret(b"", b"", wrapped.kek_id)]
    messages = set()
    for bad in tampered:
        with pytest.raises(UnwrapError) as caught:
            unwrap_secret(ring, wrapped=bad, binding=BINDING)
        messages.add(caught.value.user_message)
        # Nothing chained: the cryptography error stays out of tracebacks and logs.
        assert caught.value.__cause__ is None
        assert caught.value.__context__ is None or caught.value.__suppress_context__
    assert len(messages) == 1
    message = messages.pop()
    assert str(secret) not in message and f"{secret:x}" not in message


@pytest.mark.parametrize("other", [
    KeyBinding(tenant_id="ten_2", key_id="key_1", version=3),
    KeyBinding(tenant_id="ten_1", key_id="key_2", version=3),
    KeyBinding(tenant_id="ten_1", key_id="key_1", version=4),
])
def test_wrong_associated_data_fails(ring, other):
    wrapped = wrap_secret(ring, secret=secrets.randbits(64), binding=BINDING)
    with pytest.raises(UnwrapError):
        unwrap_secret(ring, wrapped=wrapped, binding=other)


def test_kek_id_is_bound_too():
    first, second = Kek.generate(), Kek.generate()
    ring = Keyring([first, second])
    wrapped = wrap_secret(ring, secret=secrets.randbits(64), binding=BINDING)
    relabelled = WrappedSecret(wrapped.ciphertext, wrapped.nonce, second.id)
    with pytest.raises(UnwrapError):
        unwrap_secret(ring, wrapped=relabelled, binding=BINDING)


def test_associated_data_is_unambiguous():
    a = associated_data(KeyBinding(tenant_id="ab", key_id="c", version=1), "k")
    b = associated_data(KeyBinding(tenant_id="a", key_id="bc", version=1), "k")
    assert a != b


def test_a_kek_not_on_the_ring_is_a_kek_error(ring):
    wrapped = wrap_secret(ring, secret=secrets.randbits(64), binding=BINDING)
    with pytest.raises(KekError) as caught:
        unwrap_secret(Keyring([Kek.generate()]), wrapped=wrapped, binding=BINDING)
    assert "KEK" in caught.value.user_message


@pytest.mark.parametrize("bad", [-1, 2**256, True, 1.0, "5"])
def test_only_64_or_256_bit_integers_are_wrapped(ring, bad):
    with pytest.raises(InvalidInput):
        wrap_secret(ring, secret=bad, binding=BINDING)


@pytest.mark.parametrize("secret", [2**64, 2**256 - 1, secrets.randbits(256) | 2**255])
def test_256_bit_secrets_seal_as_32_bytes(ring, secret):
    wrapped = wrap_secret(ring, secret=secret, binding=BINDING)
    assert len(wrapped.ciphertext) == 32 + 16
    assert unwrap_secret(ring, wrapped=wrapped, binding=BINDING) == secret


def test_rewrap_moves_a_secret_to_the_newest_kek():
    old, new = Kek.generate(), Kek.generate()
    secret = secrets.randbits(64)
    wrapped = wrap_secret(Keyring([old]), secret=secret, binding=BINDING)
    moved = rewrap_secret(Keyring([new, old]), wrapped=wrapped, binding=BINDING)
    assert moved.kek_id == new.id and moved.nonce != wrapped.nonce
    assert unwrap_secret(Keyring([new]), wrapped=moved, binding=BINDING) == secret
    with pytest.raises(KekError):
        unwrap_secret(Keyring([old]), wrapped=moved, binding=BINDING)
