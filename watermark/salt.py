"""Per-generation salts: how a `diverse` key gives a new text for the same prompt.

Gumbel-max sampling with a PRF keyed only by (key, the last w tokens) is a deterministic
function of the prompt: the same prompt under the same key gives the same text at any
temperature (vLLM's scheme has the same property). A `diverse` key draws a salt s in
[0, :data:`SALTS`) per generation and watermarks under a salted secret
``derive(secret, "hallmark_salt/<s>")``: every PRF, sub-key (key A, key B, the keyed coin)
and kernel sees only that 64-bit secret, so nothing downstream of the key changes.

Each salted secret is an ordinary key, so each token stays distortion-free. Generations
under different salts are independent draws, which is what makes repeated generations as
diverse as unwatermarked sampling (measured: bench/diversity.py). A detector that does not
know the salt tests the :data:`SALTS` salted secrets as :data:`SALTS` keys with Šidák's
correction over them: at most log2(SALTS) = 4 bits of p-value and SALTS x the PRF work;
the ledger records each generation's salt, so a detector that identifies the generation
knows it. A salt comes from the request's seed when it has one (so a seed reproduces the
text) and from the OS's randomness otherwise (:func:`salt_for`).
"""

from __future__ import annotations

import secrets

from watermark import prf

SALTS = 16
"""How many salts a `diverse` key draws from (S). Detection without the ledger tests all of
them: cost S x the PRF work and at most log2(S) bits of p-value."""
SALT_DOMAIN = "hallmark_salt/"
SEED_SALT_DOMAIN = "hallmark_seed_salt"


def check_salt(salt: int) -> int:
    """``salt`` if it is an integer in [0, SALTS), else ValueError."""
    if isinstance(salt, bool) or not isinstance(salt, int) or not 0 <= salt < SALTS:
        raise ValueError(f"a salt must be an integer in [0, {SALTS})")
    return salt


def salted_secret(secret: int, salt: int) -> int:
    """The 64-bit secret a `diverse` key's generation with ``salt`` runs under:
    SHA-256("hallmark_salt/<salt>" || secret as 8 bytes big-endian), first 8 bytes."""
    return prf.derive_key(secret, f"{SALT_DOMAIN}{check_salt(salt)}")


def salt_for(seed: int | None, index: int = 0) -> int:
    """The salt of a generation: from the request's ``seed`` (the ``index``-th of the
    request's ``n`` choices) when given, so that a seed reproduces a text; else uniform
    from the OS's randomness."""
    if seed is None:
        return secrets.randbelow(SALTS)
    prf.check_key(seed)
    return (prf.derive_key(seed, SEED_SALT_DOMAIN) + index) % SALTS


def distinct_salts(seed: int | None, n: int) -> list[int]:
    """``n`` distinct salts (n <= SALTS) for the choices of one request: consecutive from
    a start drawn as :func:`salt_for`, so that n choices never repeat a text by sharing a salt."""
    if not 1 <= n <= SALTS:
        raise ValueError(f"n must be between 1 and {SALTS}")
    start = salt_for(seed)
    return [(start + i) % SALTS for i in range(n)]
