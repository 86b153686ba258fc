"""A real gateway for tests: a migrated SQLite store with two tenants, their keys and tokens,
and the local engine on the bundled models, served by uvicorn on a free local port."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from keys import migrate
from keys.db import open_store
from keys.kek import generate_kek_file
from keys.lifecycle import create_key, import_key
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from keys.tokens import issue_token
from service.app import create_app
from service.settings import ServiceSettings
from watermark.spec import WatermarkSpec

from tests.service.engine_models import TEST_DRAFT, TEST_MODEL  # noqa: F401 - re-exported for tests


@dataclass
class Gateway:
    url: str
    tokens: dict[str, str]
    store_settings: StoreSettings
    app: object
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


FIXED_SECRETS = {"acme": 0x5CC4_7A1D_0000_0001, "globex": 0x5CC4_7A1D_0000_0002}
"""Key secrets for modules whose tests pick outputs with a property (long enough, detected,
with a span): with them a seed gives the same text on every run. With random keys about one
run in 15 drew a key whose first 100-token output of "The function returns" was pydoc
boilerplate (near-zero entropy: log10 p about -3.5, not detected), failing such a test."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def provision(tmp: Path, database_url: str | None = None,
              secrets: dict[str, int] | None = None, modes: dict[str, str] | None = None,
              scopes: tuple[str, ...] = ()) -> tuple[StoreSettings, dict[str, str]]:
    """Tenants acme (dual key) and globex (gumbel), their tokens and an admin token, in a new
    SQLite file under ``tmp`` or in the (empty) database at ``database_url``.

    Keys are random unless ``secrets`` fixes a tenant's secret: a watermarked sample is a
    function of the key as well as the seed, so a test that needs the same text on every
    run (an output with a given property) must fix the key too. ``modes``: a tenant's key
    mode (watermark.spec.Mode; default `deterministic`, the mode these tests were written for)."""
    secrets = secrets or {}
    modes = modes or {}

    def key(session, store, tenant: str, spec: WatermarkSpec) -> None:
        if tenant in secrets:
            import_key(session, store.keyring, tenant=tenant, secret=secrets[tenant], spec=spec, actor="test",
                       source="test")
        else:
            create_key(session, store.keyring, tenant=tenant, actor="test", spec=spec)

    kek_file = tmp / "kek.key"
    generate_kek_file(kek_file)
    settings = StoreSettings(database_url=database_url or f"sqlite:///{tmp / 'hallmark.db'}", kek_file=kek_file)
    store = open_store(settings, require_kek=True, check_schema=False, create=True)
    tokens = {}
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            create_tenant(session, name="acme", actor="test")
            key(session, store, "acme", WatermarkSpec(algorithm="dual_key_gumbel",
                                                      mode=modes.get("acme", "deterministic")))
            create_tenant(session, name="globex", actor="test")
            key(session, store, "globex", WatermarkSpec(mode=modes.get("globex", "deterministic")))
            # ``scopes``: extra scopes of the tenant tokens (service/access: "evidence" for per-token evidence).
            tokens["acme"] = issue_token(session, tenant="acme", actor="test", scopes=scopes).raw_token
            tokens["globex"] = issue_token(session, tenant="globex", actor="test", scopes=scopes).raw_token
            tokens["admin"] = issue_token(session, tenant=None, admin=True, actor="test").raw_token
    finally:
        store.close()
    return settings, tokens


def add_tenant(gateway: "Gateway", name: str) -> str:
    """A new tenant of a running gateway with a key (its id returned) and a token
    (``gateway.tokens[name]``)."""
    store = open_store(gateway.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            create_tenant(session, name=name, actor="test")
            key_id = create_key(session, store.keyring, tenant=name, actor="test").key_id
            gateway.tokens[name] = issue_token(session, tenant=name, actor="test").raw_token
    finally:
        store.close()
    return key_id


def revoke(gateway: "Gateway", key_id: str) -> None:
    """Revoke a key as compromised, as `hallmark keys revoke` does."""
    from keys.lifecycle import revoke_key

    store = open_store(gateway.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            revoke_key(session, key_id=key_id, reason="leaked (test)", actor="test")
    finally:
        store.close()


def stored_secrets(gateway: "Gateway") -> dict[str, int]:
    """Each tenant's key secret as the gateway's store holds it (one key per tenant)."""
    from keys.material import detection_keys

    store = open_store(gateway.store_settings, require_kek=True)
    try:
        with store.transaction(write=False) as session:
            return {k.tenant: k.material.secret for k in detection_keys(session, store.keyring)}
    finally:
        store.close()


def start(tmp: Path, database_url: str | None = None, secrets: dict[str, int] | None = None,
          modes: dict[str, str] | None = None, scopes: tuple[str, ...] = (), **overrides) -> Gateway:
    store_settings, tokens = provision(tmp, database_url, secrets, modes, scopes)
    options = {"model": TEST_MODEL, "draft_model": TEST_DRAFT, "device": "cpu", "max_batch": 8,
               "detect_rate_per_minute": 100_000, "detect_burst": 100_000,
               # No detection worker process per test gateway (a process of ~600 MB each, alive
               # until the test run ends): tests/service/access/test_offload.py asks for one.
               "detect_workers": 0, **overrides}
    settings = ServiceSettings(**options)
    app = create_app(settings, store_settings=store_settings)
    url, server, thread = serve(app)
    return Gateway(url, tokens, store_settings, app, server, thread)


def serve(app) -> tuple[str, uvicorn.Server, threading.Thread]:
    """Serve ``app`` with uvicorn in a daemon thread on a free local port, once it has started:
    (its URL, the server, the thread). Stop it with ``server.should_exit = True`` and a join."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, proxy_headers=False))  # as `hallmark serve`
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 300
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the test gateway did not start")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread
