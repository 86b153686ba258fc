"""The salts the ledger knows for a text: a `diverse` key is tested under them alone.

A `diverse` key's generation ran under one of 16 salts (watermark.salt), recorded with its
ledger entries. When the ledger identifies the text's generation (an exact copy, by output
hash, or shared k-grams whose chance-collision bound passes the threshold, keys.kgrams), the
detector tests that key under the recorded salt(s) only, instead of all 16 with Šidák's
correction over them (up to log10 16 = 1.2 in log10 p; bench/results/diversity.md).

Valid as a test: which generation the ledger finds depends on the text's tokens and on
digests keyed by the key's own secret, not on the PRF values under any salted secret, so on
text independent of the key the chosen salt's scores are as null as any salt's. Keys the
ledger says nothing about keep all 16 salts.
"""

from __future__ import annotations

import math
from typing import Sequence

from detector.detect import DetectorConfig
from detector.forms import distinct_forms
from detector.result import Candidate
from keys import kgrams
from keys.errors import KeyStoreError
from keys.ledger import hash_output
from keys.ledger_read import find_generations_by_output_hash, generation_salts
from service.auth import Identity
from service.http_errors import store_error
from service.state import Services


def narrowed_by_ledger(services: Services, identity: Identity, tenant: str | None, candidates: Sequence[Candidate],
                       forms: Sequence[Sequence[int]], text: str | None, config: DetectorConfig) -> Sequence[Candidate]:
    """``candidates`` with each `diverse` key that the ledger identifies for this text kept
    only under the salts its generations recorded (unchanged when there is no such key)."""
    keys = list(dict.fromkeys((c.info.key_id, c.key.secret) for c in candidates
                              if c.info.salt is not None and c.info.key_id and c.info.tenant is not None))
    if not keys:
        return candidates  # the same list: the caller's cached KeySet of it stays valid
    scope = identity.tenant_id if not identity.admin else (None if tenant is None else services.tenant_id(tenant))
    bound = math.log10(config.threshold)
    try:
        with services.store.transaction(write=False) as session:
            found: dict[str, str] = {}  # generation id -> key id
            if text:
                for entry in find_generations_by_output_hash(session, output_sha256=hash_output(text), tenant_id=scope):
                    if entry.key_id is not None:
                        found[entry.id] = entry.key_id
            cache = kgrams.KgramCache()
            for tokens in distinct_forms(forms, kgrams.K):
                for match in kgrams.find_matches(session, keys=keys, token_ids=tokens, tenant_id=scope, cache=cache):
                    if match.log10_false_match_bound <= bound:
                        found[match.generation_id] = match.key_id
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
