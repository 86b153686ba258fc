"""The ledger look-up of one detection, made once and read twice.

A detection asks the ledger two things of the same text: which `diverse` keys' generations it
identifies (service.ledger_salts, before the watermark is scored, to test those keys under
their recorded salt) and which generations it cites as a second basis (service.detection,
after). Both rest on the same two look-ups: generations whose output is exactly the text
(output hash) and generations sharing k-grams with any form of it (ledger.kgrams, one hash and
one query for every key under scheme 2). :func:`look_up` makes them once, in one read
transaction of 2 statements (issue 30): the exact copies' ids and every k-gram row the text
and its matched generations need (ledger.kgram_cache.KgramCache.read_all: the candidates
named by the in-process digest index, ledger.kgram_index, which the same statement keeps
current from the log, instead of a probe of every digest; the rows of generations already
checked against the log are kept, not read again); those generations'
entries, leaves, tenants, key states and the latest checkpoint (ledger.read.detection_facts),
from which the exact copies are built (ledger.read.exact_copies). The basis then reuses its k-gram rows for the shared tokens'
evidence, and the salts and key states of what it found, so that it needs no query at all;
the report's tlog-proofs read only when a published checkpoint covers a cited entry. Stores
with scheme 1 k-gram rows, or without a log key, read more (per-part reads). Rows are append-only and a
generation's are written in one transaction, so what the look-up read stays right after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from detector.forms import distinct_forms
from detector.segmentation import Recovered
from detector.result import Candidate
from keys import key_states
from ledger import kgrams
from keys.errors import KeyStoreError
from ledger.kgrams import KgramCache, KgramMatch
from ledger.entries import GenerationEntry, hash_output
from ledger.read import (GenerationFacts, detection_facts, exact_copies, find_generations_by_output_hash,
                         generation_facts)
from service.auth import Identity
from service.http_errors import store_error
from service.kgram_hashing import kgram_cache
from service.state import Services


@dataclass
class LedgerLookup:
    """What the ledger holds for one text, in the scope of one detection."""

    scope: str | None
    """The tenant whose ledger is searched (None: every tenant's)."""
    exact: list[GenerationEntry] = field(default_factory=list)
    """Generations whose output is exactly the text (its output hash)."""
    forms: list[list[int]] = field(default_factory=list)
    """The distinct forms of the text searched for k-grams (detector.forms.distinct_forms)."""
    kgram: list[list[KgramMatch]] = field(default_factory=list)
    """Per form, the k-gram matches under the stored candidate keys (no shared evidence yet)."""
    cache: KgramCache = field(default_factory=kgram_cache)
    """The rows the look-ups fetched: the basis's shared positions read them, no query again."""
    salts: dict[str, int] | None = None
    """The salt each found generation (exact or k-gram) records, for those that record one
    (ledger.read.generation_salts); None: not read."""
    at_generation: dict[str, str | None] = field(default_factory=dict)
    """The key state each k-gram match's generation recorded (keys.key_states.states_at_generation)."""
    now: dict[str, str] = field(default_factory=dict)
    """The state now of each found generation's key (keys.key_states.current_states)."""
    generation: GenerationEntry | None = None
    """The exact copy whose own token ids were recovered (service.generation_ids), if any."""
    generation_ids: Recovered | None = None
    """Its token ids (their SHA-256 the recorded one) and their character ranges in the text."""
    facts: GenerationFacts | None = None
    """What statement 3 read of the generations found (ledger.read.detection_facts): the
    facts above come from it, and the report's tlog-proofs (service.ledger_log.entry_proofs)."""


class LazySession:
    """A read session opened on first use (``open_`` enters the transaction): the ledger basis
    usually needs none, everything it reads having come with the look-up (its salts, key
    states and k-gram rows), and a transaction's BEGIN and COMMIT cost ~0.1 ms."""

    def __init__(self, open_: Callable[[], object]) -> None:
        self._open = open_
        self._session = None

    def __getattr__(self, name: str):
        if self._session is None:
            self._session = self._open()
        return getattr(self._session, name)


def stored_keys(candidates: Sequence[Candidate]) -> list[tuple[str, int]]:
    """(key id, secret) of each stored candidate key, once per key (a `diverse` key is one
    candidate per salt)."""
    return list(dict.fromkeys((c.info.key_id, c.key.secret) for c in candidates
                              if c.info.tenant is not None and c.info.key_id))


def ledger_scope(services: Services, identity: Identity, tenant: str | None) -> str | None:
    """The tenant id whose ledger a detection searches: the token's tenant, or for an admin
    token the tenant asked for (None: every tenant)."""
    return identity.tenant_id if not identity.admin else (None if tenant is None else services.tenant_id(tenant))


def _with_facts(session, found: LedgerLookup) -> None:
    """The salts and key states of what ``found`` holds: from statement 3 (``found.facts``)
    where it read them all, else one query each (none when it holds nothing). The salt
    narrowing and the basis read them instead of querying again."""
    generations = [e.id for e in found.exact] + [m.generation_id for ms in found.kgram for m in ms]
    key_ids = [e.key_id for e in found.exact] + [m.key_id for ms in found.kgram for m in ms]
    facts = found.facts
    if facts is not None and all(g in facts.checked for g in generations):  # read in statement 3
        found.salts = {g: facts.salts[g] for g in generations if g in facts.salts}
        found.at_generation = {g: facts.at_generation[g] for g in generations if g in facts.at_generation}
        found.now = {k: facts.now[k] for k in key_ids if k and k in facts.now}
        return
    # Salts and the key state each generation recorded, one query ({} without one when none).
    found.salts, found.at_generation = generation_facts(session, generations)
    if not generations:
        return
    found.now = key_states.current_states(session, key_ids)


def look_up(services: Services, identity: Identity, tenant: str | None, candidates: Sequence[Candidate],
            forms: Sequence[Sequence[int]], text: str | None,
            recover: Callable[[object, LedgerLookup], None] | None = None) -> LedgerLookup:
    """Both look-ups of one detection: ``text``'s exact copies (none when ``text`` is empty)
    and every form's k-gram matches under the stored ``candidates``. ``recover(session,
    found)``: called in the same transaction once the exact copies are known, to recover
    their generation's token ids (service.generation_ids)."""
    found = LedgerLookup(scope=ledger_scope(services, identity, tenant))
    keys = stored_keys(candidates)
    if not text and not keys:
        return found
    try:
        with services.store.transaction(write=False) as session:
            output = hash_output(text) if text else None
            # Statement 1: the exact copies of the text (its output hash), the k-gram rows of
            # every form, and every row of the generations these name; statement 2: those
            # generations' entries, leaves, tenants, key states and the latest checkpoint. The
            # exact copies are built from these (ledger.read.exact_copies); what follows reads them.
            searched = distinct_forms(forms, kgrams.K)
            generations = found.cache.read_all(session, found.scope, searched if keys else [], (),
                                               output_sha256=output)
            if generations is not None:
                found.facts = detection_facts(session, generations)
                found.cache.use_facts(found.facts)
                if text:
                    found.exact = exact_copies(session, found.facts, found.cache.copies, output_sha256=output,
                                               tenant_id=found.scope)
            elif text:  # no k-gram key (so no scheme 2 row): the exact copies on their own
                found.exact = find_generations_by_output_hash(session, output_sha256=output, tenant_id=found.scope)
            if found.exact and recover is not None:
                recover(session, found)
            if keys:
                # Every form of the text is searched, not only the one the watermark scores best
                # (detector.forms.merge_form_matches says why and what it costs).
                searched = distinct_forms(forms, kgrams.K)
                live = found.cache.prefetch(session, keys, found.scope, searched)
                if live:
                    found.forms = [list(tokens) for tokens in searched]
                    found.kgram = [kgrams.find_matches(session, keys=live, token_ids=tokens, tenant_id=found.scope,
                                                       cache=found.cache) for tokens in searched]
            _with_facts(session, found)
    except KeyStoreError as exc:
        raise store_error(exc) from None
    return found
