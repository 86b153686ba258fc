"""A watermark key: a secret (64 or 256 bits, as its spec's PRF says) with its spec, and the
sub-keys derived from it (each as wide as the secret).

The secret never appears in ``repr``/``str``; :func:`fingerprint` names a key without
revealing it.

Two values are computed from HMAC-SHA256(secret as 8 bytes big-endian, or 32 for a secret
above 2**64 (:func:`watermark.prf.secret_bytes`), label):

- :func:`check_value`, its first 16 hex digits (64 bits). It confirms a guessed secret
  offline, so it never leaves the store: it is the ``watermark_keys.fingerprint`` column,
  which catches a re-sealed foreign secret on unwrap and a duplicate import.
- :func:`fingerprint`, its first 6 hex digits (24 bits): what tenants, receipts, detection
  results, the CLI and logs show. Each value is shared by about 2**40 of the 2**64 secrets,
  so it is no offline check of the secret: brute force over the whole space leaves 2**40
  candidates, and a random guess that matches is the secret with probability 2**-40.

Why truncation and not an HMAC under a server-held secret: a truncated value needs no
extra secret in the store (no table, no migration, nothing more to re-wrap on KEK
rotation or to back up), it stays the same across KEK rotations, and anyone who holds the
key legitimately (an exported key, a vLLM keyring file, the plugin) can still compute and
check it without the server, so receipts and keyrings stay verifiable offline. The cost:
24 bits still single out a secret drawn from a space smaller than about 2**24 (a
low-entropy imported key such as a vLLM config's ``key: 42``), and two keys can show the
same fingerprint (the key id, not the fingerprint, names a key uniquely). A server-keyed
HMAC would close the first gap and is the upgrade path if low-entropy imports matter.
"""

from __future__ import annotations

import dataclasses
import functools
import hmac
from dataclasses import dataclass, field

from watermark import prf, salt as salts
from watermark.spec import WatermarkSpec

FINGERPRINT_LABEL = b"hallmark/key-fingerprint/v1"
KEY_A_DOMAIN = "key_a"
KEY_B_DOMAIN = "key_b"
# Hallmark's extension: the keyed speculative acceptance coin (vLLM has no such key).
KEY_COIN_DOMAIN = "hallmark_coin"
_DUAL_TAGS = (KEY_A_DOMAIN.encode(), KEY_B_DOMAIN.encode())


# 64 bits: stored, never shown. 24 bits: shown; about 2**40 secrets share each value.
CHECK_VALUE_HEX_DIGITS = 16
FINGERPRINT_HEX_DIGITS = 6


def check_value(secret: int) -> str:
    """16 hex digits of HMAC-SHA256(secret, label): the store's private integrity and
    duplicate check. It identifies the secret, so never show it (see the module docstring)."""
    # hmac.digest: the one-shot HMAC in C, a few times faster than hmac.new (keys are
    # checked one by one when a store's keys are opened).
    return hmac.digest(prf.secret_bytes(secret), FINGERPRINT_LABEL, "sha256").hex()[:CHECK_VALUE_HEX_DIGITS]


def fingerprint(secret: int) -> str:
    """The public name of a key: 6 hex digits (24 bits), shared by about 2**40 secrets."""
    return check_value(secret)[:FINGERPRINT_HEX_DIGITS]


def fingerprint_of_check_value(value: str) -> str:
    """The public fingerprint of a stored :func:`check_value` (its prefix), without the secret."""
    return value[:FINGERPRINT_HEX_DIGITS]


@dataclass(frozen=True)
class WatermarkKey:
    """The secret and spec one generation or detection runs under.

    ``salt`` (a `diverse` key's generation, :mod:`watermark.salt`): every PRF key below
    derives from :attr:`prf_secret`, the salted secret, while :attr:`secret` and the
    fingerprint stay the key's own (k-gram records, the ledger, the key store name the key,
    not the salt). None: the secret itself (a `deterministic` key, or a `diverse` key not
    yet given a generation's salt)."""

    secret: int = field(repr=False)
    spec: WatermarkSpec = field(default_factory=WatermarkSpec)
    salt: int | None = None

    def __post_init__(self) -> None:
        prf.check_key(self.secret, self.spec.key_bits)
        if self.salt is not None:
            salts.check_salt(self.salt)
            if not self.spec.salted:
                raise ValueError("only a key in mode 'diverse' with diversity 'salt' takes a salt")

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.secret)

    def with_salt(self, salt: int | None) -> "WatermarkKey":
        """This key under a generation's ``salt`` (None: unsalted)."""
        return dataclasses.replace(self, salt=salt)

    def salted_keys(self) -> tuple["WatermarkKey", ...]:
        """This unsalted `diverse` key under each salt, in salt order: the keys a detector
        that does not know a text's salt tests. Equal to ``with_salt(s)`` for each s, with
        their PRF keys (:attr:`prf_secret`, and :attr:`key_a`, :attr:`key_b` of a dual key)
        derived here in one pass. Opening a store derives these 3 x SALTS sub-keys for every
        diverse key; one at a time through ``with_salt`` and the cached properties, Python's
        per-object overhead cost several times the SHA-256s themselves."""
        if not self.spec.salted or self.salt is not None:
            raise ValueError("only an unsalted key in mode 'diverse' with diversity 'salt' has salted keys")
        dual = self.spec.algorithm == "dual_key_gumbel"
        out = []
        for salt, derived in enumerate(salts.salted_secrets(self.secret, _DUAL_TAGS if dual else (),
                                                            self.spec.key_bits)):
            values = {"secret": self.secret, "spec": self.spec, "salt": salt, "prf_secret": derived[0]}
            if dual:
                values["key_a"], values["key_b"] = derived[1], derived[2]
            # Built without __init__: its checks passed for this key's secret and spec, and the
            # salt comes from range(SALTS). The cached properties' values go in with the fields.
            key = object.__new__(WatermarkKey)
            key.__dict__.update(values)
            out.append(key)
        return tuple(out)

    # Sub-keys are derived once per key object (a SHA-256 each): detection reads them for
    # every text, and a service keeps its keys' objects in its key cache.
    @functools.cached_property
    def prf_secret(self) -> int:
        """The secret the PRFs run under (as wide as the secret): the secret, or its salted secret."""
        return self.secret if self.salt is None else salts.salted_secret(self.secret, self.salt, self.spec.key_bits)

    @functools.cached_property
    def key_a(self) -> int:
        return prf.derive_key(self.prf_secret, KEY_A_DOMAIN, self.spec.key_bits)

    @functools.cached_property
    def key_b(self) -> int:
        return prf.derive_key(self.prf_secret, KEY_B_DOMAIN, self.spec.key_bits)

    @functools.cached_property
    def key_coin(self) -> int:
        return prf.derive_key(self.prf_secret, KEY_COIN_DOMAIN, self.spec.key_bits)

    def row_keys(self) -> "RowKeys":
        """The keys and routing share of this key's sampler rows (:class:`RowKeys`)."""
        return row_keys(self)

    def scoring_keys(self) -> tuple[int, ...]:
        """The PRF keys a token of this key's text may carry: (key,) or (key_a, key_b)."""
        if self.spec.algorithm == "gumbel":
            return (self.prf_secret,)
        return (self.key_a, self.key_b)


@dataclass(frozen=True)
class RowKeys:
    """What one request's sampler rows carry (unsigned keys, as wide as the PRF's): the single source of
    the key A / key B / alpha derivation for every engine (local scheduler, vLLM plugin,
    route replay).

    A single-key (`gumbel`) request uses its secret as key A *and* key B with alpha 0: the
    routing coin never picks key B then, and if any path did draw under key B (a
    speculative residual or bonus draw), the token would still carry the request's one
    key, never a public key such as 0. vLLM's `gumbel` watermark has a single PRF keyed by
    the secret, so this is also what its text carries.
    """

    key_a: int
    """The key of a `gumbel` request; derive(secret, "key_a") of a dual-key one."""
    key_b: int
    """derive(secret, "key_b") of a dual-key request; the secret itself for `gumbel`."""
    key_coin: int
    """The keyed acceptance coin's key (dual-key only; 0 otherwise)."""
    alpha: float
    """Probability of key B for a non-speculative token (0 for `gumbel`)."""
    prf: str = prf.PHILOX_V1
    """The PRF version the keys are for: 256-bit keys go to the samplers as HMAC midstates
    (:mod:`watermark.hmac_rows`)."""


UNKEYED = RowKeys(key_a=0, key_b=0, key_coin=0, alpha=0.0)
"""Rows of an unwatermarked request (every token from the ordinary stream)."""


def row_keys(key: WatermarkKey | None) -> RowKeys:
    """The sampler-row keys of ``key`` (:data:`UNKEYED` for None: an opted-out request)."""
    if key is None:
        return UNKEYED
    if key.spec.algorithm == "gumbel":
        return RowKeys(key_a=key.prf_secret, key_b=key.prf_secret, key_coin=0, alpha=0.0, prf=key.spec.prf)
    return RowKeys(key_a=key.key_a, key_b=key.key_b, key_coin=key.key_coin, alpha=key.spec.alpha, prf=key.spec.prf)
