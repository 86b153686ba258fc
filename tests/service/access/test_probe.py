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


def test_the_in_process_index_follows_the_store_rollbacks_expiry_and_other_writers(tmp_path):
    """Each family space is indexed in the process and read incrementally (issue 31, third
    round): a placement rolled back, rows another writer added or deleted, and rows past the
    window must leave the same verdicts as reading the store whole."""
    store = open_store(StoreSettings(database_url=f"sqlite:///{tmp_path / 'p.db'}",
                                     kek=SecretStr(Kek.generate().to_base64())), check_schema=False, create=True)
    migrate.upgrade(store.engine)
    key = secrets.token_bytes(32)
    texts = [probe.sketch(key, variant(HUMAN, i)) for i in range(6)]

    def place(sketch, now, per_day=2):
        with store.transaction() as session:
            return probe.guard(session, principal="q", query=sketch, per_day=per_day, min_share=0.5, now=now)

    try:
        t0 = 1_000_000.0
        assert place(texts[0], t0).admitted
        # A placement whose transaction rolls back leaves nothing behind, in the store or the index.
        with pytest.raises(RuntimeError):
            with store.transaction() as session:
                assert probe.guard(session, principal="q", query=texts[1], per_day=2, min_share=0.5, now=t0 + 1).admitted
                raise RuntimeError("rolled back")
        assert place(texts[2], t0 + 2).admitted  # the second of the family, not the third
        assert not place(texts[3], t0 + 3).admitted
        assert place(texts[0], t0 + 4).repeat  # an exact repeat: answered, not counted
        # Another writer deletes the family's rows (the owner pruning, say): the count differs and
        # the space is read again whole.
        with store.transaction() as session:
            session.execute(probe.delete(probe.ProbeQuery).where(probe.ProbeQuery.principal == "q"))
        assert place(texts[4], t0 + 5).admitted
        # A day later the window holds none of it.
        later = t0 + probe.WINDOW_S + 10
        assert place(texts[5], later).admitted and place(texts[3], later + 1).admitted
        assert not place(texts[1], later + 2).admitted
    finally:
        store.close()


def _related_by_definition(query, other, min_share):
    """:func:`probe.related` as first written: both sketches' sets at the common level."""
    level = max(query.level, other.level)
    mine, theirs = query.at(level), other.at(level)
    if not mine or not theirs:
        return False
    scale = 1 << level
    common, smaller = len(mine & theirs) * scale, min(len(mine), len(theirs)) * scale
    if smaller < probe.MIN_MATCH:
        return mine == theirs
    if common < probe.MIN_MATCH:
        return False
    return common >= min(max(probe.ABSOLUTE, probe.DENSITY * min(smaller, probe.CAP)), min_share * smaller)


def test_related_counts_a_common_level_without_building_the_others_set_and_decides_alike():
    """The guard's comparison (issue 31 item 5: it ran on the writes' thread every admission
    waits for) gives what the sets at the common level give, at every pair of levels."""
    import random

    rng = random.Random(9)
    secret = b"k" * 32
    base = [rng.randrange(300, 5000) for _ in range(6_000)]
    sketches = []
    for size in (2, 4, 40, 300, 900, 2_000, 6_000):
        for overlap in (0.0, 0.3, 0.7, 1.0):
            start = rng.randrange(0, len(base) - size + 1)
            ids = [t if rng.random() < overlap else rng.randrange(300, 5000) for t in base[start:start + size]]
            sketches.append(probe.sketch_of_forms(secret, [ids]))
    assert len({s.level for s in sketches}) >= 3  # sampled and whole sketches both
    pairs = 0
    for query in sketches:
        for other in sketches:
            for share in (0.25, 0.5):
                assert probe.related(query, other, share) == _related_by_definition(query, other, share)
                pairs += 1
    assert pairs == 2 * len(sketches) ** 2
    decided = [probe.related(q, o, 0.5) for q in sketches for o in sketches]
    assert any(decided) and not all(decided)
