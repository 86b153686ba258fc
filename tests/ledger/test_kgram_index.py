"""The in-process k-gram index (ledger.kgram_index): a detection's look-up names its candidates
from it instead of probing the table per digest, and answers exactly as the probe does: on
an untouched store, for generations logged since the index was read (by this store object or
another process's), and after an operator deletes, changes, relabels or inserts k-gram rows
(the index only suggests; the fresh rows and the log decide). A log head it cannot follow
sends the look-up back to the probe."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from pydantic import SecretStr
from sqlalchemy import event, text

from keys.db import open_store
from keys.settings import StoreSettings
from ledger import kgram_index, kgrams
from ledger.entries import record_generation
from ledger.kgram_cache import forget_verified
from ledger.log import tlog
from ledger.read import detection_facts

from tests.service.tamper import owner


def _gen(store, tenant, key, tokens) -> str:
    with store.transaction() as session:
        entry = record_generation(session, tenant_id=tenant.id, key_id=key.key_id, key_version=key.version,
                                  engine="local", model="tiny", spec=key.spec, prompt_tokens=3,
                                  watermarked_tokens=len(tokens), unwatermarked_reason=None, output_text="x",
                                  token_ids=tokens, kgram_set=kgrams.kgram_set(key.key_id, key.material.secret,
                                                                               tokens))
    return entry.id


def _edited(tokens, rng, every=12):
    edited = list(tokens)
    for i in range(0, len(edited), every):
        edited[i] = rng.randrange(50_000)
    return edited


def _read(store, keys, tokens, scope, *, index: bool, statements: list | None = None):
    """A detection's look-up (service.ledger_lookup's read_all, facts, find_matches), with the
    index or with the probe; ``statements``: every statement it sent."""
    def count(conn, cursor, statement, parameters, context, executemany):
        if statement.split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
            statements.append(statement)

    saved = kgram_index.ENABLED
    kgram_index.ENABLED = index
    try:
        with store.transaction(write=False) as session:
            tlog.authority(session)  # the store's keys: opened once per process, not per request
            if statements is not None:
                event.listen(store.engine, "before_cursor_execute", count)
            try:
                cache = kgrams.KgramCache()
                generations = cache.read_all(session, scope, [tokens])
                cache.use_facts(detection_facts(session, generations))
                return kgrams.find_matches(session, keys=keys, token_ids=tokens, tenant_id=scope, cache=cache)
            finally:
                if statements is not None:
                    event.remove(store.engine, "before_cursor_execute", count)
    finally:
        kgram_index.ENABLED = saved


def _index(store) -> kgram_index.KgramIndex:
    with store.transaction(write=False) as session:
        key = tlog.required_authority(session).kgram_key
    return kgram_index.index_of(store, key)


def _probe_statements(statements):
    """Statements that probe ledger_kgrams by the text's digests (the index's job)."""
    return [s for s in statements if "digest IN (" in s and "FROM ledger_kgrams WHERE digest" in s]


@pytest.fixture
def made(store, two_tenants):
    forget_verified()
    kgram_index.forget_indexes()
    t = two_tenants(beta_key=True)
    rng = random.Random(31)
    tokens = [rng.randrange(50_000) for _ in range(160)]
    target = _gen(store, t.acme, t.acme_key, tokens)
    # Another tenant's generation sharing a 40-token run (33 k-grams), and one sharing one k-gram.
    _gen(store, t.beta, t.beta_key, tokens[:40] + [rng.randrange(50_000) for _ in range(80)])
    _gen(store, t.acme, t.acme_key, tokens[60:68] + [rng.randrange(50_000) for _ in range(60)])
    yield t, rng, tokens, target
    forget_verified()
    kgram_index.forget_indexes()


def _scopes(t):
    both = [(t.acme_key.key_id, t.acme_key.material.secret), (t.beta_key.key_id, t.beta_key.material.secret)]
    return [(both, t.acme.id), (both, t.beta.id), (both, None)]


def test_the_index_answers_as_the_probe_with_no_probe(store, made):
    t, rng, tokens, target = made
    texts = [tokens, _edited(tokens, rng), _edited(tokens, rng, every=5), [rng.randrange(50_000) for _ in range(90)]]
    for text_tokens in texts:
        for keys, scope in _scopes(t):
            probed = _read(store, keys, text_tokens, scope, index=False)
            forget_verified()  # the index's candidates read and checked in full, as the probe's
            seen: list[str] = []
            assert _read(store, keys, text_tokens, scope, index=True, statements=seen) == probed
            assert not _probe_statements(seen), seen
            # The k-gram read (with the index's catch-up) and the facts (none when nothing matched).
            assert len(seen) == (2 if probed else 1) or (len(seen) == 2 and text_tokens is tokens), seen
            assert _read(store, keys, text_tokens, scope, index=True) == probed  # warm: rows kept
    index = _index(store)
    snapshot = index.snapshot()
    assert snapshot.size == 3 * 0 + (160 - 7) + (120 - 7) + (68 - 7)  # every scheme 2 row, once
    with store.transaction(write=False) as session:
        assert snapshot.covered == tlog.read_head(session, None)[0]


def test_generations_logged_since_are_found_on_the_next_look_up(store, made, settings):
    """Another process (another store object on the same database) records a generation after
    this one's index was read: this one's next look-up finds it, in the same two statements."""
    t, rng, tokens, _ = made
    keys, scope = _scopes(t)[0]
    _read(store, keys, tokens, scope, index=True)
    covered = _index(store).snapshot().covered
    fresh = [rng.randrange(50_000) for _ in range(100)]
    other = open_store(StoreSettings(database_url=settings.database_url,
                                     kek=SecretStr(settings.kek.get_secret_value())), require_kek=True)
    try:
        new = _gen(other, t.acme, t.acme_key, fresh)
    finally:
        other.close()
    edited = _edited(fresh, rng)
    seen: list[str] = []
    found = _read(store, keys, edited, scope, index=True, statements=seen)
    assert [m.generation_id for m in found] == [new] and len(seen) == 2
    assert _index(store).snapshot().covered > covered
    forget_verified()
    assert _read(store, keys, edited, scope, index=True) == _read(store, keys, edited, scope, index=False) == found


_TAMPERS = {
    # One of the target's rows (the text shares it) deleted, or its digest changed, after indexing.
    "row deleted": "DELETE FROM ledger_kgrams WHERE id IN (SELECT min(id) FROM ledger_kgrams WHERE generation_id = :g)",
    "digest changed": "UPDATE ledger_kgrams SET digest = 12345 WHERE id IN "
                      "(SELECT min(id) FROM ledger_kgrams WHERE generation_id = :g)",
    "every row deleted": "DELETE FROM ledger_kgrams WHERE generation_id = :g",
    "relabelled to the other tenant": "UPDATE ledger_kgrams SET key_id = :k, tenant_id = :t WHERE generation_id = :g",
    # Rows inserted without a log entry: the text's digests under a generation never logged,
    # and one more row on the target (its rows no longer what the log committed to).
    "rows of an unlogged generation": "INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest, scheme) "
                                      "SELECT tenant_id, 'f00000000000000000000000000000ff', key_id, digest, scheme "
                                      "FROM ledger_kgrams WHERE generation_id = :g",
    "a row added to the target": "INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest, scheme) "
                                 "SELECT tenant_id, generation_id, key_id, 777, scheme FROM ledger_kgrams "
                                 "WHERE generation_id = :g LIMIT 1",
}


@pytest.mark.parametrize("tamper", list(_TAMPERS))
def test_rows_tampered_after_indexing_answer_as_the_probe(store, made, database_url, tamper):
    """The index read the target's authentic rows; an operator then edits the table. Cold
    (the rows not kept, ledger.kgram_cache.VerifiedRows), the look-up reads the candidate's
    rows fresh: the target is never cited, and every answer is the probe's on the same
    tampered table. Warm (kept before the edit), both answer from the rows the log holds."""
    t, rng, tokens, target = made
    scopes = _scopes(t)
    texts = [tokens, _edited(tokens, rng)]
    before = [[_read(store, keys, x, scope, index=True) for keys, scope in scopes] for x in texts]
    assert target in {m.generation_id for m in before[1][0]}
    with owner(database_url) as connection:
        connection.execute(text(_TAMPERS[tamper]), {"g": target, "k": t.beta_key.key_id, "t": t.beta.id})
    # Warm: the target's rows were kept when first checked; the answer is the untampered one.
    assert [[_read(store, keys, x, scope, index=True) for keys, scope in scopes] for x in texts] == before
    for x in texts:
        for keys, scope in scopes:
            forget_verified()
            probed = _read(store, keys, x, scope, index=False)
            forget_verified()
            seen: list[str] = []
            found = _read(store, keys, x, scope, index=True, statements=seen)
            assert not _probe_statements(seen)
            # The same matches, counts and states. The bound's Bonferroni factor is the probe's
            # max(the scope's finished generations, the generations seen sharing a digest):
            # rows an operator inserted or moved into the scope raise the probe's "seen" past
            # the scope's count (a weaker bound); the index holds only rows the log holds, so
            # its bound is the untampered store's. Never stronger than the evidence allows:
            # equal, or the untampered factor.
            assert [dataclasses.replace(m, log10_false_match_bound=0.0) for m in found] == \
                [dataclasses.replace(m, log10_false_match_bound=0.0) for m in probed], (x is tokens, scope)
            untampered = {(m.generation_id, m.key_id): m.log10_false_match_bound
                          for m in before[texts.index(x)][scopes.index((keys, scope))]}
            for m, p in zip(found, probed):
                assert m.log10_false_match_bound in (p.log10_false_match_bound,
                                                     untampered.get((m.generation_id, m.key_id)))
            assert ("f00000000000000000000000000000ff" not in {m.generation_id for m in probed})
            # Tampered, the target is never cited; the unlogged generation's rows leave it intact.
            assert (target in {m.generation_id for m in probed}) is (
                tamper == "rows of an unlogged generation" and scope != t.beta.id)


def test_a_log_it_cannot_follow_is_probed(store, made, database_url):
    """A leaf beyond the head (an operator's row), or a head behind what was indexed (a store
    restored from a backup): the look-up probes the table, with the probe's answer."""
    t, rng, tokens, target = made
    keys, scope = _scopes(t)[0]
    edited = _edited(tokens, rng)
    expected = _read(store, keys, edited, scope, index=True)
    assert [m.generation_id for m in expected][:1] == [target]
    with owner(database_url) as connection:
        connection.execute(text("INSERT INTO log_leaves (idx, leaf_hash, kind, entry_id, tenant_id, kgrams_sha256, "
                                "kid, data, mac, created_at) SELECT idx + 1000, leaf_hash, kind, NULL, tenant_id, "
                                "kgrams_sha256, kid, data, mac, created_at FROM log_leaves "
                                "WHERE idx = (SELECT max(idx) FROM log_leaves)"))
    forget_verified()
    seen: list[str] = []
    assert _read(store, keys, edited, scope, index=True, statements=seen) == expected
    assert _probe_statements(seen)  # the index's statement, then the probe
    with owner(database_url) as connection:
        connection.execute(text("DELETE FROM log_leaves WHERE idx >= 1000"))
        connection.execute(text("UPDATE log_head SET size = 1 WHERE id = 1"))  # behind: not this log any more
    forget_verified()
    seen.clear()
    _read(store, keys, edited, scope, index=True, statements=seen)
    assert _probe_statements(seen)
    assert _index(store).snapshot().covered == 0  # dropped: read again from the log


def test_lookup_of_shared_and_repeated_digests():
    """The arrays' look-up: a digest several generations recorded gives every row; scope and
    the candidate threshold as the probe's GROUP BY gives them; the delta merges."""
    index = kgram_index.KgramIndex()
    base = index.snapshot()
    rows = [("g1", "k1", "t1", np.array([5, 9, 11, 40], np.int64)),
            ("g2", "k2", "t2", np.array([9, 11, 12], np.int64)),
            ("g3", "k1", "t1", np.array([9, 100], np.int64))]
    index.advance(base, 3, rows)
    snap = index.snapshot()
    assert snap.covered == 3 and snap.size == 9
    index.advance(base, 4, [("g4", "k1", "t1", np.array([1], np.int64))])  # base is stale: ignored
    assert index.snapshot() is snap
    query = np.array([9, 11, 40, 77], np.int64)
    found = kgram_index.find(snap, query, None, 2)
    assert {k: set(v.tolist()) for k, v in found.pairs.items()} == {("g1", "k1"): {9, 11, 40}, ("g2", "k2"): {9, 11},
                                                                  ("g3", "k1"): {9}}
    assert found.candidates == ["g1", "g2"] and found.near == ["g3"]
    scoped = kgram_index.find(snap, query, "t2", 2)
    assert {k: set(v.tolist()) for k, v in scoped.pairs.items()} == {("g2", "k2"): {9, 11}}
    assert scoped.candidates == ["g2"]
    index.advance(snap, 5, [("g5", "k1", "t1", np.array([77, 9], np.int64))])
    later = index.snapshot()
    assert kgram_index.find(later, query, "t1", 2).candidates == ["g1", "g5"]
    assert kgram_index.find(snap, query, "t1", 2).candidates == ["g1"]  # a snapshot never changes
    # A row copied (the same digest twice in one generation) counts once, as count(DISTINCT).
    index.advance(later, 6, [("g6", "k1", "t1", np.array([300, 300], np.int64))])
    copied = kgram_index.find(index.snapshot(), np.array([300], np.int64), None, 2)
    assert copied.candidates == [] and copied.near == ["g6"] and len(copied.pairs["g6", "k1"]) == 2
