"""Database faults under a running gateway, on PostgreSQL: while the database is unreachable
requests fail with a clear 503 (never a 500, never a hang), and the gateway recovers by
itself within 5 s of the database coming back; a read-only database gives a clear 503 and
writes no partial record.

The outage is a TCP proxy between the gateway and the server that the test stops and
starts (restarting the shared server would disturb other tests); `bench/soak.py` restarts
the real server."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from keys import migrate
from keys.db import create_store_engine
from tests.keys.conftest import PG_ADMIN_URL, reachable_pg_server
from tests.service import gateway as gw

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


class Proxy:
    """A TCP proxy to ``target`` that can drop every connection and refuse new ones."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.pairs: list[socket.socket] = []
        self.listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.target)
            self.pairs += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def down(self) -> None:
        self.up = False
        for s in self.pairs:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.pairs = []

    def close(self) -> None:
        self.down()
        self.listener.close()


@pytest.fixture(scope="module")
def pg_url():
    server = reachable_pg_server()
    url = server.url_for(server.create_database())
    engine = create_store_engine(url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    yield url
    server.close()


@pytest.fixture(scope="module")
def faulty(pg_url, tmp_path_factory):
    parsed = make_url(pg_url)
    proxy = Proxy((parsed.host or "127.0.0.1", parsed.port or 5432))
    via_proxy = parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    gateway = gw.start(tmp_path_factory.mktemp("faults"), via_proxy, draft_model=None, key_cache_seconds=0.5,
                       max_tokens_cap=16, default_max_tokens=8)
    yield gateway, proxy
    gateway.stop()
    proxy.close()


def _call(gateway, path, body):
    return httpx.post(gateway.url + path, json=body, timeout=30,
                      headers={"Authorization": f"Bearer {gateway.tokens['acme']}"})


def _records(pg_url) -> int:
    engine = create_engine(pg_url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT count(DISTINCT generation_id) FROM ledger_entries")).scalar_one()
    finally:
        engine.dispose()


def test_database_outage_gives_503_then_recovers_by_itself(faulty, pg_url):
    gateway, proxy = faulty
    assert _call(gateway, "/v1/generate", {"prompt": "The", "max_tokens": 2}).status_code == 200
    before = _records(pg_url)
    proxy.down()
    time.sleep(1.0)  # beyond the key and token caches' 0.5 s
    for path, body in (("/v1/generate", {"prompt": "The", "max_tokens": 2}), ("/v1/detect", {"text": "hello"})):
        started = time.monotonic()
        response = _call(gateway, path, body)
        assert response.status_code == 503, (path, response.text)
        assert response.json()["error"]["code"] in ("database_unavailable", "unavailable")
        assert time.monotonic() - started < 10  # a clear answer, not a hang
    ready = httpx.get(gateway.url + "/readyz", timeout=30)
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
    proxy.up = True
    back = time.monotonic()
    while True:
        if _call(gateway, "/v1/generate", {"prompt": "The", "max_tokens": 2}).status_code == 200:
            break
        assert time.monotonic() - back < 5, "no recovery within 5 s of the database coming back"
        time.sleep(0.1)
    assert httpx.get(gateway.url + "/readyz", timeout=30).status_code == 200
    assert _records(pg_url) == before + 1  # refused generations left no record


def test_read_only_database_is_a_clear_503_without_partial_records(faulty, pg_url):
    gateway, _ = faulty
    name = make_url(pg_url).database
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    before = _records(pg_url)
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
            # Pooled sessions keep their settings: end them, as a failover to a replica would.
            connection.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                       f"WHERE datname = '{name}'")
        response = _call(gateway, "/v1/generate", {"prompt": "The", "max_tokens": 2})
        assert response.status_code == 503, response.text
        assert "read-only" in response.json()["error"]["message"] or "provenance" in response.json()["error"]["message"]
        assert "text" not in response.json()
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"ALTER DATABASE {name} SET default_transaction_read_only = off")
            connection.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                       f"WHERE datname = '{name}'")
        admin.dispose()
    assert _records(pg_url) == before
    assert _call(gateway, "/v1/generate", {"prompt": "The", "max_tokens": 2}).status_code == 200
