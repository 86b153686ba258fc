"""Ledger retrieval by keyed k-gram hashes: an edited copy matches its generation, an
unrelated text does not, other keys and tenants see nothing, and no token id is stored."""

from __future__ import annotations

import hashlib
import hmac
import random

import numpy as np
import pytest
from sqlalchemy import func, select

from keys.models import LedgerKgram
from ledger import kgram_digests, kgrams
from ledger.entries import record_generation


@pytest.fixture
def setup(two_tenants):
    made = two_tenants(beta_key=True)
    return made.acme, made.acme_key, made.beta, made.beta_key


def _generate(store, tenant, key, tokens):
    with store.transaction() as session:
        entry = record_generation(session, tenant_id=tenant.id, key_id=key.key_id, key_version=key.version,
                                  engine="local", model="tiny", spec=key.spec, prompt_tokens=3,
                                  watermarked_tokens=len(tokens), unwatermarked_reason=None,
                                  output_text="x", token_ids=tokens,
                                  kgram_set=kgrams.kgram_set(key.key_id, key.material.secret, tokens))
    return entry.id, len(kgrams.digests(tokens, key.material.secret))


def test_edited_copy_matches_its_generation_only(store, setup):
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(1)
    tokens = [rng.randrange(50_000) for _ in range(300)]
    generation_id, stored = _generate(store, acme, acme_key, tokens)
    _generate(store, acme, acme_key, [rng.randrange(50_000) for _ in range(300)])
    assert stored == 300 - kgrams.K + 1
    edited = list(tokens)
    for i in range(0, 300, 12):  # one substitution every 12 tokens: only some 8-grams survive
        edited[i] = rng.randrange(50_000)
    keys = [(acme_key.key_id, acme_key.material.secret)]
    with store.transaction(write=False) as session:
        found = kgrams.find_matches(session, keys=keys, token_ids=edited, tenant_id=acme.id)
        assert [m.generation_id for m in found] == [generation_id]
        match = found[0]
        assert 0 < match.matched < match.queried and match.log10_false_match_bound < -100
        assert match.to_dict()["share"] == pytest.approx(match.matched / match.queried)
        unrelated = [rng.randrange(50_000) for _ in range(300)]
        assert kgrams.find_matches(session, keys=keys, token_ids=unrelated, tenant_id=acme.id) == []
        # Another tenant's scope, or another key, finds nothing.
        assert kgrams.find_matches(session, keys=keys, token_ids=edited, tenant_id=beta.id) == []
        other = [(beta_key.key_id, beta_key.material.secret)]
        assert kgrams.find_matches(session, keys=other, token_ids=edited, tenant_id=None) == []
        # No token id or text is stored: only 63-bit keyed digests.
        digests = session.scalars(select(LedgerKgram.digest)).all()
        assert digests and all(0 <= d < 2**63 for d in digests) and not set(digests) & set(tokens)
        # The rows a look-up fetched give the same shared positions as a query of their own.
        plain = kgrams.matched_positions(session, key_id=acme_key.key_id, generation_id=generation_id,
                                         secret=acme_key.material.secret, token_ids=edited, skip=4)
        cache = kgrams.KgramCache()
        kgrams.find_matches(session, keys=keys, token_ids=edited, tenant_id=acme.id, cache=cache)
        assert plain and plain == kgrams.matched_positions(
            session, key_id=acme_key.key_id, generation_id=generation_id, secret=acme_key.material.secret,
            token_ids=edited, skip=4, cache=cache)


def test_digests_are_keyed_and_the_bound_is_monotone():
    tokens = list(range(20))
    assert kgrams.digests(tokens, 1) != kgrams.digests(tokens, 2)
    assert kgrams.digests(tokens[:7], 1) == set()
    assert kgrams.false_match_log10(0, 10, 10, 1) == 0.0
    bounds = [kgrams.false_match_log10(x, 300, 300, 1000) for x in range(1, 6)]
    assert all(b2 < b1 for b1, b2 in zip(bounds, bounds[1:])) and bounds[0] < -10


def test_position_digests_are_the_hmac_of_each_kgram():
    import hashlib
    import hmac

    tokens = [3, 2**32 - 1, 0, 77, 5, 9, 1, 4, 8, 8, 8, 123456, 6]
    key = kgrams.kgram_key(0xDEADBEEF)
    grams = [b"".join(t.to_bytes(4, "big") for t in tokens[i:i + kgrams.K]) for i in range(len(tokens) - kgrams.K + 1)]
    want = [int.from_bytes(hmac.new(key, g, hashlib.sha256).digest()[:8], "big") >> 1 for g in grams]
    assert kgrams.position_digests(tokens, 0xDEADBEEF) == want


def test_position_digests_memo_hashes_each_kgram_once():
    # The memo serves the pure-Python path (no numba); the compiled one hashes a text in one pass.
    python = kgram_digests._keyed_position_digests_python
    rng = random.Random(3)
    tokens = [rng.randrange(50_000) for _ in range(60)]
    edited = tokens[:30] + [7] + tokens[30:]
    key = kgrams.kgram_key(11)
    memo: dict[bytes, int] = {}
    assert python(tokens, key, memo=memo) == kgrams.position_digests(tokens, 11)
    assert len(memo) == len(tokens) - kgrams.K + 1
    assert python(edited, key, memo=memo) == kgrams.position_digests(edited, 11)
    assert len(memo) == len(tokens) - kgrams.K + 1 + kgrams.K  # only the k-grams holding the insertion
    cache = kgrams.KgramCache()
    assert cache.at(edited, 11) == kgrams.position_digests(edited, 11) != cache.at(edited, 12)


@pytest.mark.parametrize("k", [1, 8, 13, 14, 20])
def test_compiled_digests_are_hmac_sha256(k):
    # One compiled pass over a whole text (watermark.prf.hmac_compiled's SHA-256) gives, bit
    # for bit, hmac.new(key, gram).digest()[:8] >> 1 of each k-gram (ids as 4 bytes big-endian),
    # for keys of any length up to a block, and for lengths around each k's padding boundary.
    from watermark import jit

    from watermark.prf import hmac_compiled

    jit.load()  # a server's process (a one-off one stays on Python: hmac_compiled.kgram_digest_array)
    rng = random.Random(k)
    for size in [0, k - 1, k, k + 1, 127 + k, 128 + k, 129 + k, 300]:
        key = bytes(rng.randrange(256) for _ in range(rng.choice([1, 16, 32, 64])))
        tokens = [rng.choice([0, 2**32 - 1, rng.randrange(2**32)]) for _ in range(max(0, size))]
        grams = [b"".join(t.to_bytes(4, "big") for t in tokens[i:i + k]) for i in range(len(tokens) - k + 1)]
        want = [int.from_bytes(hmac.new(key, g, hashlib.sha256).digest()[:8], "big") >> 1 for g in grams]
        got = hmac_compiled.kgram_digest_array(tokens, key, k, kgram_digests.DIGEST_BITS)
        assert got is not None and got.dtype == np.int64
        assert got.tolist() == want
        assert kgram_digests.keyed_position_digests(
            tokens, key, k, digest_array=lambda t, b, n: hmac_compiled.kgram_digest_array(
                t, b, n, kgram_digests.DIGEST_BITS)) == want
        assert kgram_digests.keyed_position_digests(tokens, key, k) == want
        assert kgram_digests._keyed_position_digests_python(tokens, key, k) == want


def test_cached_lookups_match_plain_ones(store, setup):
    """find_matches and shared_positions through one KgramCache (the gateway's path, every
    form of a text) give what they give one by one, with fewer queries."""
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(5)
    tokens = [rng.randrange(50_000) for _ in range(200)]
    first, _ = _generate(store, acme, acme_key, tokens)
    second, _ = _generate(store, acme, acme_key, tokens[:60] + [rng.randrange(50_000) for _ in range(100)])
    _generate(store, beta, beta_key, tokens)  # another tenant and key: never in acme's matches
    forms = [tokens[:120] + [1, 2, 3] + tokens[120:], tokens[5:]]
    keys = [(acme_key.key_id, acme_key.material.secret), (beta_key.key_id, beta_key.material.secret)]
    secret = acme_key.material.secret
    for scope in (acme.id, None):
        with store.transaction(write=False) as session:
            cache = kgrams.KgramCache()
            for form in forms:
                plain = kgrams.find_matches(session, keys=keys, token_ids=form, tenant_id=scope)
                cached = kgrams.find_matches(session, keys=keys, token_ids=form, tenant_id=scope, cache=cache)
                assert cached == plain
                assert {first, second} <= {m.generation_id for m in plain}
                ids = [m.generation_id for m in plain if m.key_id == acme_key.key_id]
                many = kgrams.shared_positions(session, key_id=acme_key.key_id, generation_ids=ids, token_ids=form,
                                               secret=secret, skip=4, cache=cache)
                assert many == kgrams.shared_positions(session, key_id=acme_key.key_id, generation_ids=ids,
                                                       token_ids=form, secret=secret, skip=4)
                assert many == {g: kgrams.matched_positions(session, key_id=acme_key.key_id, generation_id=g,
                                                            secret=secret, token_ids=form, skip=4) for g in ids}
                assert many[first] and len(many[second]) < len(many[first])


def test_generations_searched_counts_generations_with_kgrams(store, setup):
    """The Bonferroni factor (finished entries with k >= K tokens under the key) equals the
    distinct generations with k-grams under it, every tenant, as the gateway records them:
    generations too short for a k-gram, or under another key, do not count."""
    acme, acme_key, beta, beta_key = setup
    rng = random.Random(7)
    for tenant, key, n in ((acme, acme_key, 50), (acme, acme_key, kgrams.K), (acme, acme_key, kgrams.K - 1),
                           (beta, beta_key, 50), (beta, beta_key, 3)):
        _generate(store, tenant, key, [rng.randrange(50_000) for _ in range(n)])
    with store.transaction(write=False) as session:
        for key in (acme_key, beta_key):
            distinct = session.scalar(select(func.count(func.distinct(LedgerKgram.generation_id)))
                                      .where(LedgerKgram.key_id == key.key_id))
            assert kgrams.generations_searched(session, key.key_id) == distinct == (2 if key is acme_key else 1)
