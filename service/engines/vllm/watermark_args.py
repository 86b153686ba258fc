"""The ``hallmark_*`` entries of a vLLM request's ``SamplingParams.extra_args``.

One flat schema for both ways a request names its key, because vLLM's OpenAI server
accepts only flat ``vllm_xargs`` (string, number or list values):

* ``hallmark_key_id`` (str): the key's id; always present on a watermarked request.
* ``hallmark_sealed`` (str): in-process only, the key material sealed under the gateway
  process's transport key (:mod:`.sealing`).
* ``hallmark_salt`` (int): a `diverse` key's generation salt (:mod:`watermark.salt`); the
  key's secret is salted inside the plugin, so the salt travels, never a salted secret.
* ``hallmark_seed`` (int): seeds the request's ordinary random stream (dual-key routing
  and the draws of deduplicated positions), so that the gateway can replay which tokens
  carry the watermark (:mod:`.routes`).

A request with no ``hallmark_*`` entry is not watermarked (the opt-out) unless the
server sets ``HALLMARK_VLLM_REQUIRE_WATERMARK=1``. With only a key id the plugin looks it
up in its keyring file (:mod:`.keyring`): the remote mode, where no key material ever
travels in a request.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

from service.engines.vllm import keyring as keyring_file
from service.engines.vllm import sealing
from watermark import prf
from watermark.key import WatermarkKey

PREFIX = "hallmark_"
KEY_ID = "hallmark_key_id"
SEALED = "hallmark_sealed"
SEED = "hallmark_seed"
SALT = "hallmark_salt"
KNOWN = frozenset({KEY_ID, SEALED, SEED, SALT})
REQUIRE_ENV = "HALLMARK_VLLM_REQUIRE_WATERMARK"
MAX_SEED = prf.MAX_KEY  # the stream accepts any 64-bit seed; vLLM's extra_args take uint64


class WatermarkArgsError(ValueError):
    """A request's Hallmark arguments are unusable; the message says why (never a secret)."""


@dataclass(frozen=True)
class RequestWatermark:
    """The key and stream seed one vLLM request is watermarked under."""

    key_id: str
    seed: int
    key: WatermarkKey = field(repr=False)


def new_seed() -> int:
    # 63 bits, so that the same value is also a valid vLLM (int64) seed.
    return secrets.randbelow(2**63)


def sealed_args(key_id: str, key: WatermarkKey, seed: int, transport_key: bytes) -> dict[str, Any]:
    """Arguments for the in-process engine: the key travels sealed."""
    return {KEY_ID: key_id, SEALED: sealing.seal(key_id, key, transport_key), SEED: _check_seed(seed),
            **_salt_arg(key)}


def reference_args(key_id: str, seed: int, salt: int | None = None) -> dict[str, Any]:
    """Arguments for a remote server: only the key id (the server holds the secret), and a
    `diverse` key's salt."""
    return {KEY_ID: key_id, SEED: _check_seed(seed), **({} if salt is None else {SALT: salt})}


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise WatermarkArgsError(f"{SEED} must be an integer in [0, 2**64 - 1]")
    return seed


def watermark_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")


def resolve(extra_args: Mapping[str, Any] | None, fallback_seed: int | None = None) -> RequestWatermark | None:
    """The request's watermark, or None for an opted-out request.

    ``fallback_seed`` (the request's vLLM seed) seeds the stream when ``hallmark_seed`` is
    absent; with neither, a random seed is drawn (then routes cannot be replayed).
    Raises :class:`WatermarkArgsError` for anything that cannot be honoured.
    """
    ours = {name: value for name, value in (extra_args or {}).items() if name.startswith(PREFIX)}
    unknown = sorted(set(ours) - KNOWN)
    if unknown:
        raise WatermarkArgsError(f"unknown Hallmark argument {unknown[0]!r}; expected "
                                 f"{sorted(KNOWN)}")
    if KEY_ID not in ours:
        if ours:
            raise WatermarkArgsError(f"a watermarked request needs {KEY_ID!r}")
        if watermark_required():
            raise WatermarkArgsError(f"this server watermarks every request; send {KEY_ID!r} "
                                     "(through the Hallmark gateway)")
        return None
    key_id = ours[KEY_ID]
    if not isinstance(key_id, str) or not key_id or len(key_id) > 200:
        raise WatermarkArgsError(f"{KEY_ID} must be a non-empty string")
    if SEED in ours:
        seed = _check_seed(ours[SEED])
    elif fallback_seed is not None:
        seed = fallback_seed % (2**64)
    else:
        seed = new_seed()
    prf.check_key(seed)
    if SEALED in ours:
        transport_key = sealing.transport_key_from_env()
        if transport_key is None:
            raise WatermarkArgsError(
                f"this vLLM server does not accept key material in requests; send only "
                f"{KEY_ID!r} and start the server with {keyring_file.KEYRING_ENV}=FILE"
            )
        if not isinstance(ours[SEALED], str):
            raise WatermarkArgsError(f"{SEALED} must be a string")
        opened = sealing.open_sealed(ours[SEALED], key_id, transport_key)
        return RequestWatermark(key_id=key_id, seed=seed, key=_salted(opened.key, ours.get(SALT)))
    keyring = keyring_file.keyring_from_env()
    if keyring is None:
        raise WatermarkArgsError(
            f"this vLLM server has no Hallmark keyring to resolve key {key_id!r}; start it with "
            f"{keyring_file.KEYRING_ENV}=FILE (written by `hallmark deploy keyring`)"
        )
    entry = keyring.lookup(key_id)
    return RequestWatermark(key_id=key_id, seed=seed, key=_salted(entry.key, ours.get(SALT)))


def _salt_arg(key: WatermarkKey) -> dict[str, Any]:
    return {} if key.salt is None else {SALT: key.salt}



def _salted(key: WatermarkKey, salt: Any) -> WatermarkKey:
    """The request's key under its salt: required for a `diverse` key, refused otherwise."""
    if not key.spec.salted:  # deterministic, or `head` diversity (the request's stream varies it)
        if salt is not None:
            raise WatermarkArgsError(f"{SALT} is only for a key in mode 'diverse' with diversity 'salt'")
        return key
    if salt is None:
        raise WatermarkArgsError(f"a key in mode 'diverse' needs {SALT!r} (the generation's salt)")
    try:
        return key.with_salt(salt)
    except ValueError as exc:
        raise WatermarkArgsError(f"{SALT}: {exc}") from None
