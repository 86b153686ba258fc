"""A running gateway on PostgreSQL as production runs it (issue 35's tests): the tables' owner
migrated and provisioned the store, the gateway connects as the separated service role
(keys.roles) through a proxy that can drop every packet (tests/service/blackhole.py), and
the tests attack it with that role's own connection, as a leaked DSN would."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from tests.service import gateway as gw
from tests.service.blackhole import Blackhole


@dataclass
class Stack:
    url: str
    tokens: dict[str, str]
    owner_url: str
    service_url: str
    """The service role's DSN, straight to the server (the attacker's connection)."""
    kek_file: Path
    app: object
    proxy: Blackhole
    stop: object

    def headers(self, who: str = "acme") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def as_service_role(self):
        return create_engine(self.service_url)

    def as_owner(self):
        return create_engine(self.owner_url)


def start(server, tmp: Path, **overrides) -> Stack:
    from keys.db import open_store
    from keys.roles import grant_service_role
    from keys.settings import StoreSettings
    from ledger.signing import create_signing_key
    from service.app import create_app
    from service.settings import ServiceSettings

    name = server.create_database()
    owner_url = server.url_for(name)
    store_settings, tokens = gw.provision(tmp, owner_url)
    role = f"hallmark_svc_{secrets.token_hex(4)}"
    with server.engine.connect() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
    engine = create_engine(owner_url)
    with engine.begin() as connection:
        grant_service_role(connection, role)
    engine.dispose()
    store = open_store(store_settings, require_kek=True)
    try:
        with store.transaction() as session:  # the owner sets the log and the signing key up
            create_signing_key(session, store.keyring, actor="test")
            from ledger.log.tlog import ensure_log

            ensure_log(session, store.keyring, actor="test")
    finally:
        store.close()
    parsed = make_url(owner_url)
    proxy = Blackhole((parsed.host or "127.0.0.1", parsed.port or 5432))
    direct = parsed.set(username=role)
    via_proxy = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    options = dict(model=gw.TEST_MODEL, draft_model=None, device="cpu", max_batch=8, key_cache_seconds=0.5,
                   detect_rate_per_minute=100_000, detect_burst=100_000, max_tokens_cap=16, default_max_tokens=8)
    settings = ServiceSettings(**{**options, **overrides})
    app = create_app(settings, store_settings=StoreSettings(database_url=via_proxy, kek_file=store_settings.kek_file))
    url, uvicorn_server, thread = gw.serve(app)

    def stop() -> None:
        uvicorn_server.should_exit = True
        thread.join(60)
        proxy.close()
        with server.engine.connect() as connection:
            connection.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")

    return Stack(url, tokens, owner_url, direct.render_as_string(hide_password=False), store_settings.kek_file, app,
                 proxy, stop)
