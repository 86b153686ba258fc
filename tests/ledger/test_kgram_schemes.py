"""The k-gram schemes (ledger.kgrams): new generations record scheme 2 digests under the store's
one k-gram key, matched for every key with one hash of the text and one query; scheme 1 rows
(recorded before migration 0010) still match per key with the bounds they had and still
verify; the log commits to each scheme apart, so moving, relabelling or mixing rows is caught;
KEK rotation keeps the store's k-gram key."""

from __future__ import annotations

import random

import numpy as np
import pytest
from pydantic import SecretStr
from sqlalchemy import create_engine, event, select, text

from keys import migrate
from keys.db import open_store
from keys.kek import Kek
from keys.kek_rotation import rotate_kek
from ledger.kgram_cache import VERIFIED, forget_verified
from ledger.sealed import KEK_DEPENDANTS
from keys.lifecycle import create_key
from keys.material import detection_keys
from keys.models import LedgerKgram
from keys.settings import StoreSettings
from ledger import kgram_digests, kgrams
from ledger.entries import record_generation
from ledger.log import tlog
from ledger.log.audit import audit_log
from ledger.log.leaves import (EMPTY_KGRAMS, MIXED_KGRAMS, kgram_array_commitment, kgram_commitment,
                               kgram_rows_commitment)


def _generate(store, tenant, key_id, version, spec, secret, tokens, scheme=None) -> str:
    with store.transaction() as session:
        entry = record_generation(session, tenant_id=tenant.id, key_id=key_id, key_version=version,
                                  engine="local", model="tiny", spec=spec, prompt_tokens=3,
                                  watermarked_tokens=len(tokens), unwatermarked_reason=None, output_text="x",
                                  token_ids=tokens, kgram_set=kgrams.kgram_set(key_id, secret, tokens, scheme))
    return entry.id


def _gen(store, tenant, key, tokens, scheme=None) -> str:
    return _generate(store, tenant, key.key_id, key.version, key.spec, key.material.secret, tokens, scheme)


def _edited(tokens, rng):
    edited = list(tokens)
    for i in range(0, len(edited), 12):  # one substitution every 12 tokens: only some 8-grams survive
        edited[i] = rng.randrange(50_000)
    return edited


def _one_read(session, keys, tokens, scope, exact=()):
    """find_matches as a detection's look-up runs it (service.ledger_lookup): the k-gram table
    read in one statement, the matched generations' entries, leaves and key states in one
    more (ledger.read.detection_facts), the log check answered from those."""
    from ledger.read import detection_facts

    cache = kgrams.KgramCache()
    generations = cache.read_all(session, scope, [tokens], exact)
    cache.use_facts(detection_facts(session, generations))
    return kgrams.find_matches(session, keys=keys, token_ids=tokens, tenant_id=scope, cache=cache)


def _both_paths(session, keys, tokens, scope):
    """find_matches on its own and in one read: the same matches (bounds included)."""
    alone = kgrams.find_matches(session, keys=keys, token_ids=tokens, tenant_id=scope)
    assert _one_read(session, keys, tokens, scope) == alone
    return alone


@pytest.fixture
def setup(two_tenants):
    made = two_tenants(beta_key=True)
    return made.acme, made.acme_key, made.beta, made.beta_key


def test_commitments_are_domain_separated():
    digests = {5, 2**62 + 1, 77}
    assert kgram_commitment(digests, 1) != kgram_commitment(digests, 2)
    assert kgram_commitment(set(), 1) == kgram_commitment(set(), 2) == EMPTY_KGRAMS
    assert kgram_rows_commitment([(2, d) for d in digests]) == kgram_commitment(digests, 2)
    assert kgram_rows_commitment([(1, 5), (2, 77)]) == MIXED_KGRAMS
    with pytest.raises(ValueError):
        kgram_commitment(digests, 3)
    # The detection's array form of the log check (ledger.kgram_cache.rows_match_leaf): the same strings.
    for rows in ([], [(2, d) for d in digests], [(1, d) for d in digests], [(2, 5), (2, 5), (2, 77)],
                 [(1, 5), (2, 77)], [(3, 5)], [(2, 2**63 - 1), (2, 0)]):
        schemes = np.array([r[0] for r in rows], dtype=np.int64)
        values = np.array([r[1] for r in rows], dtype=np.int64)
        assert kgram_array_commitment(schemes, values) == kgram_rows_commitment(rows), rows


def test_new_generations_record_scheme_2_and_match(store, setup):
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(11)
    tokens = [rng.randrange(50_000) for _ in range(300)]
    generation_id = _gen(store, acme, acme_key, tokens)
    _gen(store, beta, beta_key, tokens)  # the same output under another tenant and key
    edited = _edited(tokens, rng)
    keys = [(acme_key.key_id, acme_key.material.secret)]
    with store.transaction(write=False) as session:
        rows = session.execute(select(LedgerKgram.scheme, LedgerKgram.digest)
                               .where(LedgerKgram.generation_id == generation_id)).all()
        store_key = tlog.required_authority(session).kgram_key
        assert {s for s, _ in rows} == {kgrams.V2}
        # Keyed by the store's k-gram key, not the watermark key's (scheme 1).
        assert {d for _, d in rows} == set(kgrams.keyed_position_digests(tokens, store_key))
        assert not {d for _, d in rows} & kgrams.digests(tokens, acme_key.material.secret)
        assert repr(kgrams.kgram_set(acme_key.key_id, acme_key.material.secret, tokens)).count(
            str(acme_key.material.secret)) == 0
        (match,) = kgrams.find_matches(session, keys=keys, token_ids=edited, tenant_id=acme.id)
        assert match.generation_id == generation_id and match.key_id == acme_key.key_id
        assert 0 < match.matched < match.queried and match.stored == 300 - kgrams.K + 1
        # The Bonferroni factor of a scheme 2 look-up: the scope's generations (acme has one).
        assert match.log10_false_match_bound == kgrams.false_match_log10(match.matched, match.queried,
                                                                          match.stored, 1)
        # Every tenant (an operator's search): both generations, the factor the store's two.
        both = kgrams.find_matches(session, keys=keys + [(beta_key.key_id, beta_key.material.secret)],
                                   token_ids=edited, tenant_id=None)
        assert {(m.key_id, m.matched) for m in both} == {(acme_key.key_id, match.matched),
                                                         (beta_key.key_id, match.matched)}
        assert all(m.log10_false_match_bound == kgrams.false_match_log10(m.matched, m.queried, m.stored, 2)
                   for m in both)
        # Another tenant's scope, or a key not asked for, finds nothing.
        assert kgrams.find_matches(session, keys=keys, token_ids=edited, tenant_id=beta.id) == []
        assert kgrams.find_matches(session, keys=[(beta_key.key_id, 1)], token_ids=edited, tenant_id=acme.id) == []
        # Shared positions from the look-up's rows equal those of a query of their own.
        cache = kgrams.KgramCache()
        kgrams.find_matches(session, keys=keys, token_ids=edited, tenant_id=acme.id, cache=cache)
        assert kgrams.matched_positions(session, key_id=acme_key.key_id, generation_id=generation_id,
                                        secret=acme_key.material.secret, token_ids=edited, skip=4, cache=cache) \
            == kgrams.matched_positions(session, key_id=acme_key.key_id, generation_id=generation_id,
                                        secret=acme_key.material.secret, token_ids=edited, skip=4) != set()
        assert audit_log(session, tlog.authority(session)).problems == []


def test_scheme_1_rows_still_match_with_their_bound_and_verify(store, setup):
    """Rows as a store recorded them before migration 0010 (scheme 1, keyed per watermark key)
    match as before (per key, the key's generations as the Bonferroni factor), beside scheme 2
    rows of later generations, and the log verifies both."""
    acme, acme_key, _, _ = setup
    rng = random.Random(12)
    old_tokens = [rng.randrange(50_000) for _ in range(200)]
    new_tokens = [rng.randrange(50_000) for _ in range(200)]
    old = _gen(store, acme, acme_key, old_tokens, scheme=kgrams.V1)
    _gen(store, acme, acme_key, [rng.randrange(50_000) for _ in range(50)], scheme=kgrams.V1)
    new = _gen(store, acme, acme_key, new_tokens)
    keys = [(acme_key.key_id, acme_key.material.secret)]
    text_ = _edited(old_tokens, rng) + _edited(new_tokens, rng)
    with store.transaction(write=False) as session:
        assert kgrams.KgramCache().v1_keys(session) == {acme_key.key_id}
        found = {m.generation_id: m for m in kgrams.find_matches(session, keys=keys, token_ids=text_,
                                                                  tenant_id=acme.id)}
        assert set(found) == {old, new}
        # Scheme 1: what the per-key look-up gave before (the key's three finished generations).
        queried = len(kgrams.digests(text_, acme_key.material.secret))
        m = found[old]
        assert (m.queried, m.stored) == (queried, 200 - kgrams.K + 1)
        assert m.log10_false_match_bound == kgrams.false_match_log10(m.matched, queried, m.stored, 3)
        assert found[new].queried == queried and found[new].stored == 200 - kgrams.K + 1
        assert audit_log(session, tlog.authority(session)).problems == []


def _owner_sql(database_url, statement, params=None):
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(statement), params or {})
    finally:
        engine.dispose()


_MOVES = {
    "to the other tenant and key": "UPDATE ledger_kgrams SET key_id = :k, tenant_id = :t WHERE generation_id = :g",
    "to the other key only": "UPDATE ledger_kgrams SET key_id = :k WHERE generation_id = :g",
    "one row copied": "INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest, scheme) "
                      "SELECT tenant_id, generation_id, key_id, digest, scheme FROM ledger_kgrams "
                      "WHERE id IN (SELECT min(id) FROM ledger_kgrams WHERE generation_id = :g)",
    "delete": "DELETE FROM ledger_kgrams WHERE generation_id = :g",
    "insert": "INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest, scheme) "
              "SELECT tenant_id, generation_id, key_id, 12345, scheme FROM ledger_kgrams "
              "WHERE generation_id = :g LIMIT 1",
}
"""An operator's edits of a generation's k-gram rows (g: the generation, k / t: the other key and tenant)."""


def _move_kgrams(database_url, tamper: str, g: dict) -> None:
    _owner_sql(database_url, _MOVES[tamper], g)


@pytest.mark.parametrize("tamper", ["relabel", "delete", "insert", "move"])
@pytest.mark.parametrize("scheme", [kgrams.V1, kgrams.V2])
def test_tampered_rows_of_either_scheme_are_never_cited(store, setup, database_url, tamper, scheme):
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(13)
    tokens = [rng.randrange(50_000) for _ in range(120)]
    target = _gen(store, acme, acme_key, tokens, scheme=scheme)
    other = _gen(store, beta, beta_key, [rng.randrange(50_000) for _ in range(120)], scheme=scheme)
    keys = [(acme_key.key_id, acme_key.material.secret)]
    with store.transaction(write=False) as session:
        before = _both_paths(session, keys, tokens, acme.id)
        assert [m.generation_id for m in before] == [target]
    g = {"g": target, "o": other}
    if tamper == "relabel":  # the same digests, claimed under the other scheme
        _owner_sql(database_url, "UPDATE ledger_kgrams SET scheme = :s WHERE generation_id = :g",
                   {**g, "s": 3 - scheme})
    elif tamper == "delete":
        _owner_sql(database_url, "DELETE FROM ledger_kgrams WHERE id IN (SELECT min(id) FROM ledger_kgrams "
                                 "WHERE generation_id = :g)", g)
    elif tamper == "insert":
        _owner_sql(database_url, "INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest, scheme) "
                           "SELECT tenant_id, generation_id, key_id, 12345, scheme FROM ledger_kgrams "
                                 "WHERE generation_id = :g LIMIT 1", g)
    else:  # one row of the other generation moved onto the target
        _owner_sql(database_url, "UPDATE ledger_kgrams SET generation_id = :g WHERE id IN "
                                 "(SELECT min(id) FROM ledger_kgrams WHERE generation_id = :o)", g)
    with store.transaction(write=False) as session:
        if scheme == kgrams.V2:
            # The look-up above kept the target's rows, checked against the log
            # (ledger.kgram_cache.VerifiedRows): the tampered rows are not read again, and the
            # answer is the untampered one, bounds included (harmless: the rows the log holds).
            assert _one_read(session, keys, tokens, acme.id) == before
        forget_verified()  # read afresh: the tampered rows fail the log check
        assert _both_paths(session, keys, tokens, acme.id) == []
        problems = audit_log(session, tlog.authority(session)).problems
    assert any(target in p and "k-gram rows" in p for p in problems), problems


@pytest.mark.parametrize("tamper", ["to the other tenant and key", "to the other key only", "one row copied"])
@pytest.mark.parametrize("scheme", [kgrams.V1, kgrams.V2])
def test_rows_relabelled_to_another_key_or_copied_are_never_cited(store, setup, database_url, tamper, scheme):
    """The log commits to a generation's digests; the rows' key and tenant, and each row being
    there once, are checked against its logged entry too. Under scheme 2 a digest is the same
    under every key, so rows relabelled to another tenant's key would otherwise be cited in
    that tenant's detections (found by review: its generation id in the other tenant's
    answer), and a copied row would count twice (one shared k-gram reported as 32)."""
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(17)
    tokens = [rng.randrange(50_000) for _ in range(120)]
    target = _gen(store, acme, acme_key, tokens, scheme=scheme)
    acme_keys = [(acme_key.key_id, acme_key.material.secret)]
    beta_keys = [(beta_key.key_id, beta_key.material.secret)]
    g = {"g": target, "k": beta_key.key_id, "t": beta.id}
    _move_kgrams(database_url, tamper, g)
    with store.transaction(write=False) as session:
        for keys, scope in [(beta_keys, beta.id), (beta_keys, None), (acme_keys, acme.id)]:
            assert _both_paths(session, keys, tokens, scope) == [], (keys, scope)
        problems = audit_log(session, tlog.authority(session)).problems
    assert any(target in p and "k-gram rows" in p for p in problems), problems


@pytest.mark.parametrize("tamper", ["to the other tenant and key", "to the other key only", "one row copied",
                                    "delete", "insert"])
def test_kept_rows_answer_as_the_log_holds_them(store, setup, database_url, tamper):
    """A generation whose rows a look-up checked against the log is kept
    (ledger.kgram_cache.VerifiedRows) and not read again: rows edited afterwards change no
    answer in any scope (each is the untampered store's), and the entry and leaf are still
    read and checked on every look-up (a leaf that no longer commits to them: not cited)."""
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(19)
    tokens = [rng.randrange(50_000) for _ in range(120)]
    target = _gen(store, acme, acme_key, tokens)
    scopes = [([(beta_key.key_id, beta_key.material.secret)], beta.id),
              ([(beta_key.key_id, beta_key.material.secret)], None),
              ([(acme_key.key_id, acme_key.material.secret)], acme.id),
              ([(acme_key.key_id, acme_key.material.secret)], None)]
    with store.transaction(write=False) as session:
        before = [_both_paths(session, keys, tokens, scope) for keys, scope in scopes]
    assert [m.generation_id for m in before[2]] == [target]
    assert any(VERIFIED.get(key, target) is not None for key in list(VERIFIED._kept))
    g = {"g": target, "k": beta_key.key_id, "t": beta.id}
    _move_kgrams(database_url, tamper, g)
    with store.transaction(write=False) as session:
        assert [_one_read(session, keys, tokens, scope) for keys, scope in scopes] == before
    # The finished entry is still read and checked against the log on every look-up: edited,
    # it leaves the kept rows uncited.
    from tests.service.tamper import owner

    with owner(database_url) as connection:
        connection.execute(text("UPDATE ledger_entries SET output_tokens = output_tokens + 1 "
                                "WHERE generation_id = :g AND kind = 'finished'"), g)
    with store.transaction(write=False) as session:
        assert _one_read(session, scopes[2][0], tokens, scopes[2][1]) == []
    forget_verified()


def test_kek_rotation_keeps_scheme_2_matching(store, setup, database_url):
    acme, acme_key, _, _ = setup
    rng = random.Random(14)
    tokens = [rng.randrange(50_000) for _ in range(150)]
    generation_id = _gen(store, acme, acme_key, tokens)
    with store.transaction(write=False) as session:
        before = tlog.required_authority(session).kgram_key
    new = Kek.generate()
    with store.transaction() as session:
        rotation = rotate_kek(session, current=store.keyring, new=new, actor="test", dependants=KEK_DEPENDANTS)
        assert rotation.rewrapped >= 2  # key + log key
    rotated = open_store(StoreSettings(database_url=database_url, kek=SecretStr(new.to_base64())), require_kek=True)
    try:
        with rotated.transaction(write=False) as session:
            assert tlog.required_authority(session).kgram_key == before
            keys = [(k.key_id, k.material.secret) for k in detection_keys(session, rotated.keyring)]
            found = kgrams.find_matches(session, keys=keys, token_ids=_edited(tokens, rng), tenant_id=acme.id)
            assert [m.generation_id for m in found] == [generation_id]
    finally:
        rotated.close()


def test_many_keys_one_hash_and_one_query(store, setup, monkeypatch):
    """A tenant whose 50 keys all have generations: the text is hashed under one k-gram key
    and looked up in one query, whatever the keys (scheme 1 needed 50 of each)."""
    acme, acme_key, _, _ = setup
    rng = random.Random(15)
    with store.transaction() as session:
        for _ in range(49):
            create_key(session, store.keyring, tenant="acme", actor="test")
    with store.transaction(write=False) as session:
        stored = [k for k in detection_keys(session, store.keyring) if k.tenant_id == acme.id]
    assert len(stored) == 50
    outputs = {}
    for key in stored:
        tokens = [rng.randrange(50_000) for _ in range(60)]
        outputs[key.key_id] = (tokens, _generate(store, acme, key.key_id, key.version, key.spec,
                                                 key.material.secret, tokens))
    target_key = stored[17]
    tokens, target = outputs[target_key.key_id]
    keys = [(k.key_id, k.material.secret) for k in stored]
    forms = [_edited(tokens, rng) + [rng.randrange(50_000) for _ in range(400)]]  # under 500 k-grams
    hashed = []
    real = kgram_digests.hmac_states
    monkeypatch.setattr(kgram_digests, "hmac_states", lambda key: hashed.append(key) or real(key))
    # The compiled path (one pass per form and key) hashes without hmac_states: counted too.
    from service import kgram_hashing

    def counted(tokens, key, k):
        found = kgram_hashing.digest_array(tokens, key, k)
        if found is not None:  # None (numba not worth loading here): the Python path, counted above
            hashed.append(key)
        return found
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if not statement.startswith("BEGIN"):
            statements.append(statement)

    with store.transaction(write=False) as session:
        tlog.authority(session)  # the store's keys are opened once per process, not per request
        event.listen(store.engine, "before_cursor_execute", count)
        try:
            cache = kgrams.KgramCache(digest_array=counted)
            live = cache.prefetch(session, keys, acme.id, forms)
            found = kgrams.find_matches(session, keys=live, token_ids=forms[0], tenant_id=acme.id, cache=cache)
        finally:
            event.remove(store.engine, "before_cursor_execute", count)
    assert [(m.generation_id, m.key_id) for m in found] == [(target, target_key.key_id)]
    assert len(hashed) == 1  # one k-gram key: the store's
    # The text's digests (under 500 of them) looked up once for the 50 keys; besides it, the
    # keys with scheme 1 rows (none), the generations-searched count, the hit's own rows and
    # its log leaf: no statement per key.
    assert len([s for s in statements if "json_each" in s or "digest IN" in s]) == 1, statements
    assert len(statements) <= 6, statements


def test_rows_from_before_migration_0010_become_scheme_1(tmp_path):
    """The column's default labels every row recorded before 0010 as scheme 1."""
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    try:
        migrate.upgrade(engine, "0009_access_tiers")
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO ledger_kgrams (tenant_id, generation_id, key_id, digest) "
                                    "VALUES ('t', 'g', 'k', 42)"))
        migrate.upgrade(engine)
        with engine.begin() as connection:
            assert connection.execute(text("SELECT scheme, digest FROM ledger_kgrams")).all() == [(1, 42)]
    finally:
        engine.dispose()


def test_one_read_is_two_statements_and_finds_the_same(store, setup):
    """A detection's look-up (service.ledger_lookup) reads the k-gram table in one statement
    and the matched generations' facts in one more, on either backend, and finds what the
    per-part reads find: an exact copy's and an edited copy's matches, in a tenant and store-wide."""
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(21)
    tokens = [rng.randrange(50_000) for _ in range(120)]
    target = _gen(store, acme, acme_key, tokens)
    _gen(store, beta, beta_key, tokens[:40] + [rng.randrange(50_000) for _ in range(80)])  # shares 33 k-grams
    keys = [(acme_key.key_id, acme_key.material.secret), (beta_key.key_id, beta_key.material.secret)]
    seen: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    for text_tokens in (tokens, _edited(tokens, rng)):
        for scope in (acme.id, None):
            with store.transaction(write=False) as session:
                expected = kgrams.find_matches(session, keys=keys, token_ids=text_tokens, tenant_id=scope)
                assert expected and expected[0].generation_id == target
                tlog.authority(session)  # opened once per store, not per request
                seen.clear()
                event.listen(store.engine, "before_cursor_execute", count)
                try:
                    found = _one_read(session, keys, text_tokens, scope, exact=[target])
                finally:
                    event.remove(store.engine, "before_cursor_execute", count)
            assert found == expected
            queries = [q for q in seen if q.split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK")]
            assert len(queries) == 2, queries
