"""Per-generation salts (watermark.salt): golden salted secrets, seed-derived salts, and how a
salt reaches the PRF keys (and only them) through WatermarkKey."""

from __future__ import annotations

import pytest

from watermark import prf
from watermark.key import WatermarkKey, row_keys
from watermark.salt import SALTS, SaltRotation, check_salt, distinct_salts, salt_for, salted_secret
from watermark.spec import WatermarkSpec

# SHA-256("hallmark_salt/<s>" || secret as 8 bytes big-endian), first 8 bytes big-endian.
# A change here changes every diverse key's text: old texts would no longer be detected.
GOLDEN = {(0x0123456789ABCDEF, 0): 0x60B5D6F42037F43E, (0x0123456789ABCDEF, 1): 0x0DE8B3635C6FFA97,
          (0x0123456789ABCDEF, 15): 0x859EAB9675570A86, (2**64 - 1, 7): 0x295805786E49BF65,
          (0, 0): 0xF46559FAB9D9190E}
DIVERSE = WatermarkSpec(mode="diverse")


def test_salted_secrets_are_the_golden_values():
    for (secret, salt), expected in GOLDEN.items():
        assert salted_secret(secret, salt) == expected
    assert SALTS == 16


@pytest.mark.parametrize("bad", [-1, 16, 2**64, True, 1.0, "3", None])
def test_a_salt_outside_the_space_is_refused(bad):
    with pytest.raises(ValueError, match="salt"):
        check_salt(bad)


def test_a_seed_fixes_the_salt_and_none_draws_one():
    assert [salt_for(s) for s in (0, 42, 2**64 - 1)] == [4, 0, 8]  # golden: derive(seed) mod 16
    assert salt_for(42) == salt_for(42)
    drawn = {salt_for(None) for _ in range(400)}
    assert drawn == set(range(SALTS))  # uniform over 16: all seen in 400 draws (miss chance ~1e-10)
    with pytest.raises(ValueError):
        salt_for(-1)


def test_n_choices_get_distinct_salts():
    assert distinct_salts(42, 4) == [0, 1, 2, 3]
    for n in (1, 5, 16):
        salts = distinct_salts(None, n)
        assert len(set(salts)) == n and all(0 <= s < SALTS for s in salts)
    for n in (0, 17):
        with pytest.raises(ValueError):
            distinct_salts(None, n)


def test_a_salt_changes_the_prf_keys_but_not_the_keys_identity():
    for algorithm in ("gumbel", "dual_key_gumbel"):
        base = WatermarkKey(0x0123456789ABCDEF, DIVERSE.model_copy(update={"algorithm": algorithm}))
        salted = base.with_salt(1)
        assert salted.secret == base.secret and salted.fingerprint == base.fingerprint
        assert salted.prf_secret == GOLDEN[0x0123456789ABCDEF, 1] and base.prf_secret == base.secret
        # Every PRF key derives from the salted secret: it is exactly an ordinary key with that secret.
        plain = WatermarkKey(salted.prf_secret, base.spec.model_copy(update={"mode": "deterministic"}))
        assert row_keys(salted) == row_keys(plain) and salted.scoring_keys() == plain.scoring_keys()
        assert row_keys(salted) != row_keys(base)
    assert WatermarkKey(5, DIVERSE, salt=3).key_a == prf.derive_key(salted_secret(5, 3), "key_a")


def test_only_a_diverse_key_takes_a_salt():
    with pytest.raises(ValueError, match="diverse"):
        WatermarkKey(5, WatermarkSpec(), salt=1)
    with pytest.raises(ValueError, match="salt"):
        WatermarkKey(5, DIVERSE, salt=16)
    shown = repr(WatermarkKey(0x0123456789ABCDEF, DIVERSE, salt=2))
    assert "salt=2" in shown and str(0x0123456789ABCDEF) not in shown
    assert str(salted_secret(0x0123456789ABCDEF, 2)) not in shown


def test_regenerations_of_one_prompt_take_the_salts_in_turn():
    rotation = SaltRotation(capacity=2)
    taken = [rotation.take("k1", (1, 2, 3)) for _ in range(SALTS + 2)]
    assert taken == [(taken[0] + i) % SALTS for i in range(SALTS + 2)]
    assert len(set(taken[:SALTS])) == SALTS
    # Another key or prompt has its own turn; the oldest entry goes beyond the capacity.
    other = rotation.take("k2", (1, 2, 3))
    assert 0 <= other < SALTS and len(rotation._next) == 2
    rotation.take("k1", (9,))
    assert len(rotation._next) == 2
    starts = {SaltRotation().take("k", (1,)) for _ in range(300)}
    assert starts == set(range(SALTS))  # a random start (all 16 in 300 draws: miss chance ~1e-7)


@pytest.mark.parametrize("algorithm,coin", [("gumbel", "ordinary"), ("dual_key_gumbel", "ordinary"),
                                            ("dual_key_gumbel", "keyed")])
@pytest.mark.parametrize("secret", [0, 0x0123456789ABCDEF, 2**64 - 1])
def test_salted_keys_are_with_salt_of_each_salt(algorithm, coin, secret):
    """The one-pass family equals ``with_salt(s)`` in salt order, sub-keys included."""
    key = WatermarkKey(secret, WatermarkSpec(algorithm=algorithm, coin=coin, mode="diverse"))
    family = key.salted_keys()
    assert len(family) == SALTS
    for salt, salted in enumerate(family):
        reference = key.with_salt(salt)
        assert salted == reference and hash(salted) == hash(reference) and salted.salt == salt
        assert salted.prf_secret == salted_secret(secret, salt) == reference.prf_secret
        assert (salted.key_a, salted.key_b, salted.key_coin) == (reference.key_a, reference.key_b, reference.key_coin)
        assert salted.scoring_keys() == reference.scoring_keys() and row_keys(salted) == row_keys(reference)
        assert salted.fingerprint == key.fingerprint
    assert family[0].prf_secret == GOLDEN.get((secret, 0), family[0].prf_secret)


def test_only_an_unsalted_diverse_key_has_salted_keys():
    with pytest.raises(ValueError, match="diverse"):
        WatermarkKey(5, WatermarkSpec()).salted_keys()
    with pytest.raises(ValueError, match="unsalted"):
        WatermarkKey(5, DIVERSE, salt=3).salted_keys()


@pytest.mark.parametrize("key", [0, 1, 2**32 + 7, 2**64 - 1])
def test_derive_keys_is_derive_key_twice_over(key):
    tags, subs = (b"hallmark_salt/0", b"key_a", b""), (b"key_b", b"hallmark_coin")
    for tag, derived in zip(tags, prf.derive_keys(key, tags, subs)):
        first = prf.derive_key(key, tag)
        assert derived == (first, *(prf.derive_key(first, sub) for sub in subs))
    assert prf.derive_keys(key, tags) == [(prf.derive_key(key, tag),) for tag in tags]
    with pytest.raises(ValueError):
        prf.derive_keys(2**64, tags)
