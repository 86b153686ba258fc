"""Sealed key material: how an in-process gateway hands a request's key to vLLM's engine.

vLLM carries per-request data to its engine-core process in ``SamplingParams.extra_args``,
and ``SamplingParams.__repr__`` prints ``extra_args`` (vLLM logs it with
``--enable-log-requests`` and in some errors). A raw secret there would end up in logs.
So the gateway seals the secret and spec with AES-256-GCM under a *transport key*: 32
random bytes made once per gateway process and handed to vLLM's engine core through the
process environment (:data:`TRANSPORT_KEY_ENV`, inherited by the processes vLLM spawns),
never through a request. A logged sealed blob is useless without that key, and a
``vllm serve`` started without it refuses sealed material, so no HTTP client can inject
key material (remote servers resolve key ids instead, see :mod:`.keyring`).

The associated data binds the blob to its key id, so a blob cannot be replayed under
another id.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import ValidationError

from watermark import prf
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

TRANSPORT_KEY_ENV = "HALLMARK_VLLM_TRANSPORT_KEY"
TRANSPORT_KEY_BYTES = 32
NONCE_BYTES = 12
AD_LABEL = b"hallmark/vllm-sealed-key/v1\x00"


class SealingError(ValueError):
    """Sealed material that cannot be opened here. The message never holds key material."""


@dataclass(frozen=True)
class SealedKey:
    """What a sealed blob opens to."""

    key_id: str
    key: WatermarkKey = field(repr=False)


def ensure_transport_key() -> bytes:
    """This process's transport key, made (and put into the environment, so that the
    engine-core processes vLLM spawns inherit it) on first use."""
    existing = os.environ.get(TRANSPORT_KEY_ENV)
    if existing:
        return _decode_transport_key(existing)
    material = secrets.token_bytes(TRANSPORT_KEY_BYTES)
    os.environ[TRANSPORT_KEY_ENV] = base64.b64encode(material).decode("ascii")
    return material


def transport_key_from_env() -> bytes | None:
    """The transport key this process inherited, or None (a ``vllm serve`` process)."""
    value = os.environ.get(TRANSPORT_KEY_ENV)
    return _decode_transport_key(value) if value else None


def _decode_transport_key(value: str) -> bytes:
    try:
        material = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise SealingError(f"{TRANSPORT_KEY_ENV} is not base64; unset it and restart the gateway") from None
    if len(material) != TRANSPORT_KEY_BYTES:
        raise SealingError(f"{TRANSPORT_KEY_ENV} must hold {TRANSPORT_KEY_BYTES} bytes; unset it and "
                           "restart the gateway")
    return material


def _associated_data(key_id: str) -> bytes:
    return AD_LABEL + key_id.encode("utf-8")


def seal(key_id: str, key: WatermarkKey, transport_key: bytes) -> str:
    """Base64 of nonce || AES-GCM(secret and spec), bound to ``key_id``."""
    payload = json.dumps({"secret": key.secret, "spec": key.spec.public_dict()}).encode("utf-8")
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = AESGCM(transport_key).encrypt(nonce, payload, _associated_data(key_id))
    return base64.b64encode(nonce + sealed).decode("ascii")


def open_sealed(blob: str, key_id: str, transport_key: bytes) -> SealedKey:
    """The key inside ``blob``; :class:`SealingError` (one opaque reason) if it does not
    authenticate under this transport key and key id."""
    try:
        raw = base64.b64decode(blob, validate=True)
        payload = AESGCM(transport_key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:],
                                                _associated_data(key_id))
        data = json.loads(payload)
        secret = prf.check_key(data["secret"])
        spec = WatermarkSpec.model_validate(data["spec"])
    except (binascii.Error, ValueError, InvalidTag, KeyError, TypeError, ValidationError):
        raise SealingError(
            f"the sealed key material for key {key_id} does not open in this vLLM process; "
            "sealed keys are accepted only from the in-process Hallmark gateway that started it"
        ) from None
    return SealedKey(key_id=key_id, key=WatermarkKey(secret=secret, spec=spec))
