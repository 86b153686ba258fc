"""The engine key: one ``dual_key_gumbel`` key for a whole speculative vLLM deployment.

vLLM's custom logits processors do not run with speculative decoding, so a deployment
that uses MTP or EAGLE watermarks with vLLM's built-in ``dual_key_gumbel`` under one
engine-level key. Hallmark derives that key from a tenant's active key and a deployment
name (so re-running the command on every node yields the same key, and the secret never
has to be copied between them by hand)::

    engine secret = first 8 bytes of SHA-256("hallmark/vllm-engine-key/v1/" + deployment || tenant secret)

(the tenant secret as its 8 or 32 bytes, :func:`watermark.prf.secret_bytes`: for a 64-bit
tenant key this is :func:`watermark.prf.derive_key`, as before). The engine key is a 64-bit
``philox4x32-10-v1`` key whatever the tenant key's PRF, because vLLM's built-in watermark
(0.32 and 0.34) runs Philox only; the derivation is one-way, so recovering an engine key by a
2^64 search exposes that deployment's watermark, never the tenant's 256-bit key.

and imports it into the store as a key of that tenant (state verify-only beside the
tenant's active key, audited as ``key.imported`` with the derivation as its source), so
every text the deployment produces is detected and attributed to that key version.

The key reaches vLLM only through a YAML file for ``vllm serve --config FILE`` written with
mode 0600 (``watermark-config`` inside it): never on a command line, where ``ps`` and
shell history would show it. vLLM turns the file's entries into arguments in memory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.orm import Session

from keys.errors import InvalidInput
from keys.kek import Keyring
from keys.lifecycle import KeyRecord, import_key, list_keys
from keys.material import active_key
from keys.tenants import get_tenant
from service.engines.vllm.keyring import check_private, write_private
from watermark import prf
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

DOMAIN = "hallmark/vllm-engine-key/v1/"
SOURCE_PREFIX = "vllm-engine:"
WATERMARK_OPTION = "watermark-config"
_DEPLOYMENT_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class EngineKey:
    """A provisioned engine key: its store record and the key itself."""

    info: KeyRecord
    key: WatermarkKey = field(repr=False)
    created: bool
    """False when the store already held it (provisioning is idempotent)."""


def check_deployment(name: str) -> str:
    if not name or len(name) > 64 or not set(name) <= _DEPLOYMENT_CHARS:
        raise InvalidInput(f"invalid deployment name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


def derive_engine_secret(tenant_secret: int, deployment: str) -> int:
    tag = (DOMAIN + check_deployment(deployment)).encode()
    return int.from_bytes(hashlib.sha256(tag + prf.secret_bytes(tenant_secret)).digest()[:8], "big")


def engine_spec(source: WatermarkSpec) -> WatermarkSpec:
    """The tenant key's spec as vLLM's ``dual_key_gumbel`` can run it (vLLM has only the
    ordinary acceptance coin, no per-generation salt and only the Philox PRF: the engine key is a
    `deterministic` 64-bit Philox key)."""
    return source.model_copy(update={"algorithm": "dual_key_gumbel", "coin": "ordinary", "mode": "deterministic",
                                     "prf": prf.PHILOX_V1})


def provision_engine_key(session: Session, keyring: Keyring, *, tenant: str, deployment: str,
                         actor: str) -> EngineKey:
    """Derive the deployment's engine key from ``tenant``'s active key and record it in the
    store (once: a second call finds the same key and returns it)."""
    tenant_row = get_tenant(session, name=tenant)
    source = active_key(session, keyring, tenant_id=tenant_row.id)
    key = WatermarkKey(secret=derive_engine_secret(source.material.secret, deployment),
                       spec=engine_spec(source.spec))
    for info in list_keys(session):
        if info.fingerprint == key.fingerprint:
            if info.tenant_id != tenant_row.id:
                raise InvalidInput(f"the engine key of deployment {deployment!r} is stored under another "
                                   "tenant; choose another deployment name")
            return EngineKey(info=info, key=key, created=False)
    origin = f"{SOURCE_PREFIX}{deployment} derived from {source.key_id} v{source.version}"
    info = import_key(session, keyring, tenant=tenant, secret=key.secret, spec=key.spec, actor=actor,
                      source=origin)
    return EngineKey(info=info, key=key, created=True)


def vllm_config_text(key: WatermarkKey) -> str:
    """The YAML for ``vllm serve --config``: vLLM's watermark config with the key."""
    config: dict[str, Any] = {**key.spec.to_vllm(), "key": key.secret}
    header = ("# Hallmark engine key for vLLM's built-in watermark. SECRET: keep mode 0600,\n"
              "# pass with `vllm serve ... --config <this file>`, never on a command line.\n")
    return header + yaml.safe_dump({WATERMARK_OPTION: config}, sort_keys=False)


def write_engine_config(path: Path | str, key: WatermarkKey) -> Path:
    """Write the ``--config`` YAML with mode 0600 (created private, replaced atomically)."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise InvalidInput(f"{path}: vLLM reads --config files only with a .yaml or .yml suffix")
    write_private(path, vllm_config_text(key))
    return path


def read_engine_config(path: Path | str) -> WatermarkKey:
    """The key in an engine config file (refused unless private to its owner)."""
    path = Path(path)
    if not path.exists():
        raise InvalidInput(f"the engine key file {path} does not exist; write it with "
                           "`hallmark deploy engine-key`")
    check_private(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        secret, spec = WatermarkSpec.from_vllm(data[WATERMARK_OPTION])
    except Exception:  # any malformed content: never echo it, it holds the key
        raise InvalidInput(f"the engine key file {path} does not hold a vLLM watermark config; "
                           "rewrite it with `hallmark deploy engine-key`") from None
    return WatermarkKey(secret=secret, spec=spec)
