"""The salts the ledger knows for a text: a `diverse` key is tested under them alone.

A `diverse` key's generation ran under one of 16 salts (watermark.salt), recorded with its
ledger entries. When the ledger identifies the text's generation (an exact copy, by output
hash, or shared k-grams whose chance-collision bound passes the threshold, ledger.kgrams), the
detector tests that key under the recorded salt(s) only, instead of all 16 with Šidák's
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
    only under the salts its generations recorded (unchanged when there is no such key).
    ``lookup``: the detection's one ledger look-up (service.ledger_lookup), read, not
    repeated. ``exact``: whether its exact copies count (the client sent text, not token ids)."""
    diverse = {c.info.key_id for c in candidates
               if c.info.salt is not None and c.info.key_id and c.info.tenant is not None}
    if not diverse:
        return candidates  # the same list: the caller's cached KeySet of it stays valid
    bound = math.log10(config.threshold)
    found: dict[str, str] = {}  # generation id -> key id
    if exact:
        for entry in lookup.exact:
            if entry.key_id is not None:
                found[entry.id] = entry.key_id
    for matches in lookup.kgram:
        for match in matches:
            if match.key_id in diverse and match.log10_false_match_bound <= bound:
                found[match.generation_id] = match.key_id
    if not found:
        return candidates
    if lookup.salts is not None:  # read in the look-up, for every generation it found
        salts = {g: lookup.salts[g] for g in found if g in lookup.salts}
    else:
        try:
            with services.store.transaction(write=False) as session:
                salts = generation_salts(session, list(found))
        except KeyStoreError as exc:
            raise store_error(exc) from None
    known: dict[str, set[int]] = {}
    for generation_id, salt in salts.items():
        known.setdefault(found[generation_id], set()).add(salt)
    if not known:
        return candidates
    return [c for c in candidates if c.info.salt is None or c.info.key_id not in known
            or c.info.salt in known[c.info.key_id]]
