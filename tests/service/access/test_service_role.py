"""The gateway's own database role cannot reset detection budgets or probe families (issue 31
item 6, issue 35 item 6), on real PostgreSQL: a gateway connected as the service role spends
a public budget and a text family, then that role's own connection tries every way to undo it
(DELETE, UPDATE, TRUNCATE, a forged refund, a second refund, the prune function), and the
gateway still refuses."""

from __future__ import annotations

import secrets

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from keys import migrate
from keys.db import create_store_engine, open_store
from ledger.signing import create_signing_key
from keys.roles import grant_service_role
from keys.settings import StoreSettings
from service.app import create_app
from service.settings import ServiceSettings
from tests.keys.conftest import reachable_pg_server
from tests.service import gateway as gw
from tests.service.access.texts import HUMAN, variant

pytestmark = pytest.mark.postgres


@pytest.fixture
def service_gateway(tmp_path):
    yield from _service_gateway(tmp_path, public_tokens_per_day=700, detect_rate_per_minute=100_000,
                                detect_burst=100_000)


@pytest.fixture
def rate_limited_gateway(tmp_path):
    yield from _service_gateway(tmp_path, public_tokens_per_day=1e7, detect_rate_per_minute=1, detect_burst=3)


def _service_gateway(tmp_path, **limits):
    pg = reachable_pg_server()
    name = pg.create_database()
    url = pg.url_for(name)
    engine = create_store_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    store_settings, _ = gw.provision(tmp_path, url)
    store = open_store(store_settings, require_kek=True)
    try:
        with store.transaction() as session:  # the owner sets up the signing and log keys (`ledger init`)
            create_signing_key(session, store.keyring, actor="test")
    finally:
        store.close()
    role = f"hallmark_svc_{secrets.token_hex(4)}"
    owner = create_engine(url)
    with owner.begin() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        grant_service_role(connection, role)
    service_url = make_url(url).set(username=role).render_as_string(hide_password=False)
    app = create_app(ServiceSettings(model=gw.TEST_MODEL, draft_model=None, device="cpu", **limits),
                     store_settings=StoreSettings(database_url=service_url, kek_file=store_settings.kek_file))
    base, server, thread = gw.serve(app)
    service = create_engine(service_url, isolation_level="AUTOCOMMIT")
    try:
        yield base, service, owner
    finally:
        server.should_exit = True
        thread.join(60)
        service.dispose()
        owner.dispose()
        pg.drop_database(name)
        with pg.engine.connect() as connection:
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")


def _refused(service, statement: str, **params) -> str:
    with pytest.raises(DBAPIError) as raised:
        with service.connect() as connection:
            connection.execute(text(statement), params)
    return str(raised.value.orig).splitlines()[0]


def test_the_service_role_cannot_reset_budgets_or_probe_families(service_gateway):
    base, service, _ = service_gateway
    with httpx.Client(base_url=base, timeout=120) as client:
        # A family checked to its limit (3) and an address budget (700 tokens) used up.
        statuses = [client.post("/v1/public/detect", json={"text": variant(HUMAN, i)}).status_code for i in range(4)]
        assert statuses[:1] == [200] and 429 in statuses, statuses
        refused_before = client.post("/v1/public/detect", json={"text": variant(HUMAN, 9)})
        assert refused_before.status_code == 429
        with service.connect() as connection:
            rows = connection.execute(text("SELECT id, name, amount FROM access_spend WHERE amount > 0")).all()
        assert rows
        for table in ("access_spend", "probe_queries"):
            assert "permission denied" in _refused(service, f"DELETE FROM {table}")
            assert "permission denied" in _refused(service, f"TRUNCATE {table}")
        assert "permission denied" in _refused(service, "UPDATE access_spend SET amount = 0")
        assert "permission denied" in _refused(service, "UPDATE probe_queries SET created = 0")
        # A refund that settles nothing, or more than a reservation held, or one already settled.
        assert "refund" in _refused(service, "INSERT INTO access_spend (id, name, amount, created, settles) "
                                             "VALUES (:id, :name, -1e9, 0, :id)", id=secrets.token_hex(16),
                                    name=rows[0].name)
        assert "refund" in _refused(service, "INSERT INTO access_spend (id, name, amount, created, settles) "
                                             "VALUES (:id, :name, :amount, 0, :settles)", id=secrets.token_hex(16),
                                    name=rows[0].name, amount=-(rows[0].amount + 1), settles=rows[0].id)
        settled = [r for r in rows if r.name == rows[0].name]
        with service.connect() as connection:
            already = connection.execute(text("SELECT settles FROM access_spend WHERE settles IS NOT NULL")).scalars().all()
        if rows[0].id in already:
            assert "uq_access_spend_settles" in _refused(
                service, "INSERT INTO access_spend (id, name, amount, created, settles) VALUES (:id, :name, -1, 0, :s)",
                id=secrets.token_hex(16), name=rows[0].name, s=rows[0].id)
        assert settled
        # Every answered check's reservation is settled (its one refund used), even where it
        # scored exactly what it reserved: none is left for the service role to give back.
        with service.connect() as connection:
            open_reservations = connection.execute(text(
                "SELECT count(*) FROM access_spend r WHERE r.amount > 0 AND r.settles IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM access_spend s WHERE s.settles = r.id)")).scalar_one()
        assert open_reservations == 0
        # A backdated row is stamped with the database's clock.
        with service.connect() as connection:
            connection.execute(text("INSERT INTO access_spend (id, name, amount, created) VALUES ('x1', 'n', 1, 0)"))
            assert connection.execute(text("SELECT created FROM access_spend WHERE id = 'x1'")).scalar() > 1e9
            connection.execute(text("SELECT hallmark_prune_access()"))  # the only deletion: outside the window
        still = client.post("/v1/public/detect", json={"text": variant(HUMAN, 9)})
        assert still.status_code == 429 and still.json()["error"]["code"] == refused_before.json()["error"]["code"]


def test_the_service_role_cannot_refill_a_per_minute_limit(rate_limited_gateway):
    """Issue 31, third round: ``rate_limit_buckets`` was writable by the service role, so a leaked
    DSN could refill any per-minute limit. Its one write path is now the owner's
    ``hallmark_take_bucket()``: no direct write, no refund of a detection's rate, no larger
    rate or burst than the bucket was created with."""
    base, service, _ = rate_limited_gateway
    with httpx.Client(base_url=base, timeout=120) as client:
        statuses = [client.post("/v1/public/detect", json={"text": f"short check {i}"}).status_code for i in range(5)]
        assert statuses[:3] == [200] * 3 and statuses[3:] == [429, 429], statuses  # burst 3, then 1 a minute
        with service.connect() as connection:
            name = connection.execute(text("SELECT name FROM rate_limit_buckets WHERE name LIKE 'detect:%'")).scalar_one()
        for statement in ("UPDATE rate_limit_buckets SET level = 1e9", "DELETE FROM rate_limit_buckets",
                          "TRUNCATE rate_limit_buckets",
                          "INSERT INTO rate_limit_buckets (name, level, updated) VALUES ('detect:x', 1e9, 0)"):
            assert "permission denied" in _refused(service, statement), statement
        assert "refund" in _refused(service, "SELECT hallmark_take_bucket(:n, -1e9, 1, 3)", n=name)
        with service.connect() as connection:
            # A huge rate and burst passed by the caller: held to the bucket's own (1 a minute, 3).
            wait = connection.execute(text("SELECT hallmark_take_bucket(:n, 1, 1e9, 1e9)"), {"n": name}).scalar_one()
            assert wait > 0
            assert connection.execute(text("SELECT level <= 3 FROM rate_limit_buckets WHERE name = :n"),
                                      {"n": name}).scalar_one()
        refused = client.post("/v1/public/detect", json={"text": "short check again"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
