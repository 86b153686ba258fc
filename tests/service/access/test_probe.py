"""The probe guard's placement of a query on PostgreSQL, where replicas place queries of one
principal at the same moment: the second waits for the first's transaction, then counts it."""

from __future__ import annotations

import secrets
import threading

import pytest
from pydantic import SecretStr

from keys import migrate
from keys.db import create_store_engine, open_store
from keys.kek import Kek
from keys.settings import StoreSettings
from service.access import probe
from tests.service.access.texts import HUMAN, variant


@pytest.mark.postgres
def test_two_replicas_placing_a_familys_last_query_at_once_admit_one():
    from tests.keys.conftest import reachable_pg_server

    pg = reachable_pg_server()
    url = pg.url_for(pg.create_database())
    engine = create_store_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    store = open_store(StoreSettings(database_url=url, kek=SecretStr(Kek.generate().to_base64())), require_kek=True)
    key = secrets.token_bytes(32)
    sketches = [probe.sketch(key, variant(HUMAN, i)) for i in range(2)]
    try:
        verdicts = {}

        def place(name: str, sketch: probe.Sketch, hold: threading.Event | None = None) -> None:
            with store.transaction() as session:
                verdicts[name] = probe.guard(session, principal="p", query=sketch, per_day=1, min_share=0.5)
                if hold is not None:
                    hold.wait(10)  # the first replica's transaction stays open

        hold = threading.Event()
        first = threading.Thread(target=place, args=("first", sketches[0], hold))
        first.start()
        while "first" not in verdicts:
            threading.Event().wait(0.01)
        second = threading.Thread(target=place, args=("second", sketches[1]))
        second.start()
        second.join(1.0)
        waited = second.is_alive()  # blocked on the first's placement, not deciding on a stale count
        hold.set()
        first.join(10)
        second.join(10)
        assert waited
        assert verdicts["first"].admitted and not verdicts["second"].admitted
    finally:
        store.close()
        pg.close()
