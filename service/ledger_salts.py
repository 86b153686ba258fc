"""The salts the ledger knows for a text: a `diverse` key is tested under them alone.

A `diverse` key's generation ran under one of 16 salts (watermark.salt), recorded with its
ledger entries. When the ledger identifies the text's generation (an exact copy, by output
hash, or shared k-grams whose chance-collision bound passes the threshold, ledger.kgrams), the
detector tests that key under one recorded salt only (the identifying generation's), instead of all 16 with Šidák's
correction over them (up to log10 16 = 1.2 in log10 p; bench/results/diversity.md).

Valid as a test: which generation the ledger finds depends on the text's tokens and on
digests keyed by the store's k-gram key (or, for rows recorded before it, by a key derived
from the watermark key's own secret), not on the PRF values under any salted secret, so on
text independent of the key the chosen salt's scores are as null as any salt's. Keys the
ledger says nothing about keep all 16 salts. The look-ups are the detection's one
(service.ledger_lookup), read here, not repeated.
"""

from __future__ import annotations

import math
from typing import Sequence

from detector.detect import DetectorConfig
from detector.result import Candidate
from keys.errors import KeyStoreError
from ledger.read import generation_salts
from service.http_errors import store_error
from service.ledger_lookup import LedgerLookup
from service.state import Services


def narrowed_by_ledger(services: Services, lookup: LedgerLookup, candidates: Sequence[Candidate],
                       config: DetectorConfig, *, exact: bool = True) -> Sequence[Candidate]:
    """``candidates`` with each `diverse` key that the ledger identifies for this text kept
    only under the salt of the generation that identifies it (unchanged when there is no
    such key). ``lookup``: the detection's one ledger look-up (service.ledger_lookup), read,
    not repeated. ``exact``: whether its exact copies count (the client sent text, not
    token ids).

    One salt per key, never the union of several: when an exact copy identifies the
    generation (the one whose ids were recovered, else the newest), k-gram matches to other
    generations (shared boilerplate) add nothing; otherwise each key's best k-gram match
    (smallest collision bound, then most shared k-grams) names it. Which generation that is
    depends on the text and the ledger's digests, never on PRF values, so the test stays valid."""
    diverse = {c.info.key_id for c in candidates
               if c.info.salt is not None and c.info.key_id and c.info.tenant is not None}
    if not diverse:
        return candidates  # the same list: the caller's cached KeySet of it stays valid
    chosen: dict[str, str] = {}  # key id -> the generation id that names its salt
    exact_copies = [e for e in lookup.exact if e.key_id is not None] if exact else []
    if exact_copies:
        if lookup.generation is not None:
            chosen[lookup.generation.key_id] = lookup.generation.id
        for entry in exact_copies:  # newest first
            chosen.setdefault(entry.key_id, entry.id)
    else:
        bound = math.log10(config.threshold)
        best: dict[str, tuple[float, int, str]] = {}
        for matches in lookup.kgram:
            for match in matches:
                if match.key_id in diverse and match.log10_false_match_bound <= bound:
                    rank = (match.log10_false_match_bound, -match.matched, match.generation_id)
                    if match.key_id not in best or rank < best[match.key_id]:
                        best[match.key_id] = rank
        chosen = {key_id: rank[2] for key_id, rank in best.items()}
    chosen = {k: g for k, g in chosen.items() if k in diverse}
    if not chosen:
        return candidates
    if lookup.salts is not None:  # read in the look-up, for every generation it found
        salts = {g: lookup.salts[g] for g in chosen.values() if g in lookup.salts}
    else:
        try:
            with services.store.transaction(write=False) as session:
                salts = generation_salts(session, list(chosen.values()))
        except KeyStoreError as exc:
            raise store_error(exc) from None
    known = {key_id: salts[g] for key_id, g in chosen.items() if g in salts}
    if not known:
        return candidates
    return [c for c in candidates if c.info.salt is None or c.info.key_id not in known
            or c.info.salt == known[c.info.key_id]]
