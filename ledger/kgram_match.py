"""A k-gram match: a generation sharing k-grams with a text under one key, and the bound on
its happening by chance (ledger.kgrams finds them; the module docstring there derives the bound).
Pure arithmetic: no database."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ledger.kgram_digests import DIGEST_BITS

MIN_MATCHES = 2
"""Matches below this many shared k-grams are not reported."""


@dataclass(frozen=True)
class KgramMatch:
    """A generation sharing k-grams with the text under one key."""

    generation_id: str
    key_id: str
    matched: int
    """Distinct k-gram digests the text shares with the generation."""
    queried: int
    """Distinct k-gram digests of the text."""
    stored: int
    """Distinct k-gram digests recorded for the generation."""
    log10_false_match_bound: float
    """log10 of the bound on a chance (hash-collision) match this large (module docstring)."""
    shared_tokens: int | None = None
    """Scored tokens of the text inside the shared k-grams (None: not computed)."""
    log10_shared_p: float | None = None
    """log10 p of the watermark test over those tokens alone, under this key: whether the
    shared phrases were sampled under the watermark or are text any writer could produce
    (boilerplate the model reproduces with no choice to make; service.ledger_evidence)."""
    key_state_at_generation: str | None = None
    """The key's state the ledger recorded for the generation (keys.key_states)."""
    key_state_now: str | None = None
    """The key's state now."""

    def to_dict(self) -> dict[str, object]:
        return {"generation_id": self.generation_id, "key_id": self.key_id, "matched_kgrams": self.matched,
                "text_kgrams": self.queried, "generation_kgrams": self.stored,
                "share": round(self.matched / self.queried, 6) if self.queried else 0.0,
                "log10_false_match_bound": self.log10_false_match_bound,
                "shared_tokens": self.shared_tokens, "log10_shared_p": self.log10_shared_p,
                "key_state_at_generation": self.key_state_at_generation, "key_state_now": self.key_state_now}


def false_match_log10(matched: int, queried: int, stored: int, generations: int) -> float:
    """log10 of min(1, G (Q M 2^-63)^x / x!)."""
    if matched <= 0:
        return 0.0
    per_pair = math.log10(max(1, queried)) + math.log10(max(1, stored)) - DIGEST_BITS * math.log10(2.0)
    bound = math.log10(max(1, generations)) + matched * per_pair - math.lgamma(matched + 1) / math.log(10.0)
    return min(0.0, bound)
