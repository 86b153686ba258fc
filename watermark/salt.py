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
text, :func:`salt_for`); otherwise the regenerations of one prompt take the salts in turn
from a random start (:class:`SaltRotation`), since independent uniform salts from 16 values
repeat too often to make regenerations as diverse as unwatermarked sampling (measured:
bench/results/diversity.md).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections import OrderedDict

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


def salted_secret(secret: int, salt: int, bits: int = 64) -> int:
    """The secret a `diverse` key's generation with ``salt`` runs under:
    SHA-256("hallmark_salt/<salt>" || secret big-endian): its first 8 bytes for a 64-bit key,
    all 32 for a 256-bit one (:func:`watermark.prf.derive_key`)."""
    return prf.derive_key(secret, f"{SALT_DOMAIN}{check_salt(salt)}", bits)


_SALT_TAGS = tuple(f"{SALT_DOMAIN}{salt}".encode() for salt in range(SALTS))


def salted_secrets(secret: int, sub_tags: tuple[bytes, ...] = (), bits: int = 64) -> list[tuple[int, ...]]:
    """For each salt in order: ``(salted_secret(secret, salt), *sub-keys)``, each sub-key
    ``prf.derive_key(salted, tag)`` for a tag of ``sub_tags``, all derived in one call."""
    return prf.derive_keys(secret, _SALT_TAGS, sub_tags, bits)


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


class SaltRotation:
    """The salts of unseeded generations: the regenerations of one prompt under one key take
    the salts in turn, from a random start, so up to :data:`SALTS` of them in a row are all
    distinct draws (independent uniform salts would repeat one within 10 regenerations with
    probability 0.98, and a repeated salt repeats a single key's text).

    In memory, per process (a replica): past SALTS regenerations, after eviction, or across
    replicas salts can repeat. Entries are SHA-256 digests of (key id, prompt token ids): the
    prompt itself is not kept. Thread-safe."""

    def __init__(self, capacity: int = 65536) -> None:
        self._next: OrderedDict[bytes, int] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def take(self, key_id: str, prompt_ids: tuple[int, ...] | list[int]) -> int:
        """The next salt for this key and prompt."""
        digest = hashlib.sha256(repr((key_id, tuple(int(t) for t in prompt_ids))).encode()).digest()
        with self._lock:
            salt = self._next.pop(digest, None)
            if salt is None:
                salt = secrets.randbelow(SALTS)
            self._next[digest] = (salt + 1) % SALTS
            while len(self._next) > self._capacity:
                self._next.popitem(last=False)
        return salt
