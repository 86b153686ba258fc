"""The order a detection request is let through, for every tier (the routes call :func:`answer`).

1. the tier's character limit (413), before anything else (the route checks it too, before
   taking a slot);
2. a slot of the principal's (:mod:`service.access.slots`): for bodies detected in a worker
   thread, taken by the route before anything else; for small bodies detected on the event
   loop, around the core;
3. the tier's options (a tenant's threshold is a whole power of ten, at most the signing
   policy's maximum; evidence needs the
   ``evidence`` scope), then the per-token request rate (429 before the probe guard counts the
   query: a refused request is not one of its family's checks);
4. in one write: the principal's budgets admit (429 ``detection_budget_exhausted``), the
   probe guard places the query (429 ``probe_guard``), the token budgets take a reservation
   (:func:`reservation`: the text's UTF-8 bytes or its token ids, at most the token limit)
   and the evidence budget one use; concurrent requests are so admitted against a falling
   level, one after another (service.access.budgets);
5. the core (:func:`service.detection.detect`) at full precision (a large body's, of a
   principal over its share of lane time, after other principals' detections in flight:
   :meth:`service.access.lanes.Lanes.defer`);
6. the tier's answer (:mod:`service.access.shape`), its report re-signed;
7. in one write: the difference between the tokens scored and the reservation is charged
   (or refunded), and an expert's or operator's request or an evidence use is audited (no text, no text
   hash). One that holds an audit event is awaited (:func:`answered`) before the answer
   leaves, after the principal's lane (the route): the next detection runs while the commit
   is pending, and the events of the requests that ran meanwhile commit with it as one
   INSERT. A settlement alone is queued, not awaited: it only gives back what the
   reservation over-counted. A request that fails between 4 and 7 gets its reservation back.

The writes (4, 7) go through :mod:`service.access.group_commit`: committed with other
requests' writes in one transaction, off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from sqlalchemy import select

from keys import clock
from keys.audit import ACTOR_LENGTH, record_audit
from keys.errors import KeyStoreError
from keys.models import AuditEvent, Tenant
from ledger.read import find_generations_by_output_hash
from service import detection
from service.access import offload, probe, shape
from service.access.budgets import Budget, Budgets, public_reserves
from service.access.group_commit import GroupCommit, Held
from service.access.lanes import Lanes
from service.access.slots import Slots
from service.access.tiers import EXPERT, OPERATOR, PUBLIC, TENANT, Principal, access_secret, principal_of
from service.auth import Identity, resolve_tenant
from service.errors import Forbidden, RateLimited, TooLarge
from service.http_errors import store_error
from service.limits import retry_after
from service.schemas import DetectBody

log = logging.getLogger("hallmark.access")
_lock = threading.Lock()
FAIR_SWITCH_INTERVAL = 0.001


@dataclass
class Access:
    secret: bytes
    budgets: Budgets
    slots: Slots
    writes: GroupCommit
    lanes: Lanes
    audits: Held
    """Expert and operator requests' audit events, held together while others are in flight
    (the route counts each request in and out: :func:`answered`)."""


def access_of(services) -> Access:
    found = getattr(services, "_access", None)
    if found is None:
        with _lock:
            found = getattr(services, "_access", None)
            if found is None:
                writes = GroupCommit(services.store)
                found = Access(access_secret(services), Budgets(services.store), Slots(services.settings.detect_slots),
                               writes, _lanes(services.settings), Held(writes, _audit_many))
                # A detection in a worker thread holds the interpreter up to the switch interval
                # (5 ms) each time the event loop asks for it back, and another principal's
                # check hands it over a dozen times (each await): 1 ms keeps that wait small
                # (service.access.lanes). A lower interval set already (the CUDA engine's) stays.
                if sys.getswitchinterval() > FAIR_SWITCH_INTERVAL:
                    sys.setswitchinterval(FAIR_SWITCH_INTERVAL)
                services._access = found
    return found


def _lanes(settings) -> Lanes:
    return Lanes(settings.detect_queue, share=settings.detect_fair_share, window=settings.detect_fair_window_s,
                 defer_max=settings.detect_defer_max_s)


def max_chars(settings, tier: str) -> int:
    return settings.public_max_chars if tier == PUBLIC else settings.max_detect_chars


def check_size(settings, tier: str, body: DetectBody) -> None:
    """413 by character count, before any tokenisation (token ids count one each)."""
    limit = max_chars(settings, tier)
    if body.text is not None and len(body.text) > limit:
        raise TooLarge(f"text has {len(body.text)} characters; the limit is {limit}"
                       + (" for the public check" if tier == PUBLIC else ""))
    if body.text is not None and len(body.text) > settings.max_detect_tokens:
        # A byte-level tokenizer makes at most one token per UTF-8 byte: a text of no more bytes
        # than the token limit cannot exceed it, and a longer one is refused here instead of after
        # tokenising it (measured: 24 bodies of 190,000 characters took 54 s and 1.7 GB to refuse).
        size = len(body.text.encode("utf-8"))
        if size > settings.max_detect_tokens:
            raise TooLarge(f"text has {size} bytes (UTF-8) and could have as many tokens; at most "
                           f"{settings.max_detect_tokens} tokens are scored, so send at most that many bytes")
    if body.token_ids is not None and len(body.token_ids) > settings.max_detect_tokens:
        raise TooLarge(f"{len(body.token_ids)} tokens; the limit is {settings.max_detect_tokens}")


def principal(services, identity: Identity | None, client_address: str | None) -> Principal:
    return principal_of(identity, client_address, access_of(services).secret, services.settings)


GLOBAL_PUBLIC = "public:all"


def _budgets(settings, who: Principal) -> list[Budget]:
    if who.tier == PUBLIC:
        return [Budget(f"public:{who.key}", settings.public_tokens_per_day),
                Budget(f"public-wide:{who.wide}", settings.public_wide_tokens_per_day),
                Budget(GLOBAL_PUBLIC, settings.public_global_tokens_per_day)]
    if who.tier == TENANT:
        return [Budget(f"tenant:{who.key}", settings.tenant_detect_tokens_per_day)]
    return []  # expert and operator: unlimited volume


def _check_options(tier: str, identity: Identity | None, body: DetectBody, max_p: float) -> bool:
    """Whether per-token evidence is asked for and allowed (403 if asked for without the scope)."""
    if tier == TENANT:
        # Another tenant named: 403 before admission (a refused query is not one of a family's checks).
        resolve_tenant(None, identity, body.tenant)
    if tier == TENANT and body.threshold is not None:
        exponent = math.log10(body.threshold)
        if abs(exponent - round(exponent)) > 1e-9:
            # Arbitrary thresholds would let a caller bisect the p-value this tier rounds.
            raise Forbidden(f"threshold {body.threshold!r}: a tenant token may choose a whole power of ten "
                                "(1e-3, 1e-6, ...); the p-value it sees is rounded to one")
        if body.threshold > max_p * (1 + 1e-9):
            # Above its threshold a tenant sees only "p > threshold" (service.access.shape): a looser
            # threshold, stepped down a power of ten per query, would hand the ratchet its gradient back.
            raise Forbidden(f"threshold {body.threshold!r}: a tenant token may choose the provider's policy maximum "
                            f"{max_p:g} or a stricter power of ten")
    if not body.evidence:
        return False
    if tier == TENANT and "evidence" not in (identity.scopes if identity else ()):
        raise Forbidden("per-token evidence needs the 'evidence' scope, which an admin grants "
                        "(`hallmark tokens grant TOKEN_ID evidence`); leave 'evidence' out")
    return True


def _sketch_of(services, secret: bytes, body: DetectBody, k: int,
               tokens: detection.Tokenised | None = None) -> probe.Sketch:
    """The query's token k-grams as the detector will score them: the token ids sent, or the
    text's tokens as sent and in its normalised forms (service.access.probe). ``tokens``: the
    request's tokenisations, which the core then reads instead of tokenising again."""
    if body.text is None:
        return probe.sketch_of_forms(secret, [body.token_ids], k)
    tokens = tokens if tokens is not None else detection.Tokenised(services.engine.tokenizer())
    texts = [form.text for form in tokens.forms(body.text)[0]] if body.normalize else [body.text]
    return probe.sketch_of_forms(secret, [tokens.encode(t)[0] for t in texts], k)


def _own_recorded(session, identity: Identity | None, body: DetectBody) -> bool:
    """Whether ``body`` is exactly the output of one of the caller's tenant's recorded
    generations (authenticated by the log): such a check is not counted by the probe guard.
    The same text always gets the same answer, so repeating it plans nothing; an edited copy
    is another text and is counted (issue 34 item 2: the 4th check of a tenant's own
    generation was refused; bench.legit_use: a tenant's 100 generations checked twice a day
    merged into families through what the bundled model's outputs share)."""
    if identity is None or identity.tenant_id is None or body.text is None:
        return False
    digest = hashlib.sha256(body.text.encode("utf-8", "surrogatepass")).hexdigest()
    return bool(find_generations_by_output_hash(session, output_sha256=digest, tenant_id=identity.tenant_id, limit=1))


async def _write(access: Access, write: Callable[[Any], Any]) -> Any:
    """``write(session)`` committed (in a group, off the event loop); KeyStoreError -> its HTTP error."""
    return await _write_done(access.writes.submit(write))


async def _call(inline: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` here (a small body, on the event loop) or in a worker thread."""
    return fn(*args) if inline else await asyncio.to_thread(fn, *args)


@dataclass
class Charge:
    """A request's token reservation, and whether it was settled against the actual cost."""

    reserved: float = 0.0
    budgets: list[Budget] = field(default_factory=list)
    """The token budgets admission charged (settling and refunds charge the same ones)."""
    rows: dict[str, str] = field(default_factory=dict)
    """Budget name -> the reservation's spend row (what a refund names: service.access.budgets)."""
    evidence_rows: dict[str, str] = field(default_factory=dict)
    settled: bool = False
    evidence: bool = False
    """Whether admission took one use of the evidence budget (given back if no answer leaves)."""


def reservation(settings, body: DetectBody, budgets: list[Budget]) -> float:
    """What admission takes from the token budgets before the work: the token ids sent, or a
    text's UTF-8 bytes (the bundled byte-level tokenizer makes at most one token a byte), at
    most the detection token limit and at most the smallest budget's day. Settling charges or
    refunds the difference (a refund names the reservation's row: never more than it took)."""
    if body.text is None:
        estimate = float(len(body.token_ids or ()))
    else:
        estimate = float(min(settings.max_detect_tokens, len(body.text.encode("utf-8", "surrogatepass"))))
    return min([estimate] + [budget.per_day for budget in budgets])


async def _admit(services, access: Access, who: Principal, body: DetectBody, evidence: bool, inline: bool,
                 identity: Identity | None = None, tokens: detection.Tokenised | None = None) -> Charge:
    settings = services.settings
    budgets = _budgets(settings, who)
    evidence_budget = [Budget(f"evidence:{who.key}", settings.evidence_per_day)] if evidence and who.tier == TENANT \
        else []
    guarded = who.tier in (PUBLIC, TENANT)
    charge = Charge(reserved=reservation(settings, body, budgets) if budgets else 0.0, budgets=budgets)
    if not budgets and not evidence_budget and not guarded:
        return charge
    pool = None if inline or not guarded else offload.offload_of(services)
    if pool is not None:  # a large body's hashes in a worker process (service.access.offload)
        sketch = await pool.sketch(_sketch_of, services, access.secret, body, settings.probe_kgram)
    else:
        sketch = await _call(inline, _sketch_of, services, access.secret, body, settings.probe_kgram,
                             tokens) if guarded else None

    def admit(session) -> None:
        short = access.budgets.admit(session, budgets + evidence_budget)
        if short is not None and short[0].name == GLOBAL_PUBLIC and who.wide:
            # The global public budget is used up (a flood from many networks): this network
            # still has its reserve (issue 31: no actor closes the public check for others).
            reserve = public_reserves(settings.public_reserved_tokens_per_day, who.key, who.wide)
            others = [b for b in budgets if b.name != GLOBAL_PUBLIC]
            short = access.budgets.admit(session, others + evidence_budget + reserve)
            if short is None:
                budgets[:] = others + reserve  # charged (and settled) instead of the global one
        if short is not None:
            budget, wait = short
            what = "per-token evidence uses" if budget in evidence_budget else "detection tokens"
            raise RateLimited(f"your daily budget of {budget.per_day:.0f} {what} is used up; retry in "
                              f"{wait:.0f} s", headers=retry_after(wait) if math.isfinite(wait) else None,
                              code="detection_budget_exhausted")
        if guarded and not (who.tier == TENANT and _own_recorded(session, identity, body)):
            verdict = probe.guard(session, principal=who.family, query=sketch, per_day=settings.probe_family_per_day,
                                  min_share=settings.probe_share)
            if not verdict.admitted:
                raise RateLimited(
                    f"this text contains (or is contained in) at least {settings.probe_share:.0%} of a text checked "
                    f"{verdict.queries} times in the last 24 hours, and a text family may be checked "
                    f"{settings.probe_family_per_day} times a day (probe guard: repeated checks of one edited text, "
                    "padded or not, are how a detector is turned against the watermark); `hallmark detect` checks "
                    "locally without this limit", headers=retry_after(3600), code="probe_guard")
        if budgets and charge.reserved:
            charge.rows = access.budgets.charge(session, budgets, charge.reserved)
        if evidence_budget:
            charge.evidence_rows = access.budgets.charge(session, evidence_budget, 1.0)

    await _write(access, admit)
    charge.evidence = bool(evidence_budget)
    return charge


def _settle(services, access: Access, who: Principal, identity: Identity | None, tokens: int, *,
            evidence: bool, verdict: str, charge: Charge) -> Future | asyncio.Future | None:
    """Submit the request's settlement; the future of its write when it holds an audit event
    (the caller awaits it, :func:`answered`, before the answer leaves), else None."""
    budgets = charge.budgets
    audit = who.tier in (EXPERT, OPERATOR) or (evidence and who.tier == TENANT)
    if not budgets and not audit:
        charge.settled = True
        return None
    event = None
    if audit:
        event = {"actor": f"api:{identity.token_id}",
                 "action": _AUDIT_ACTIONS[who.tier] if who.tier in _AUDIT_ACTIONS else "detection.evidence",
                 "tenant_id": identity.tenant_id,
                 "details": {"token_id": identity.token_id, "tier": who.tier, "tokens": tokens,
                             "evidence": evidence, "verdict": verdict}}

    def settle(session) -> None:
        if budgets and (charge.rows or float(tokens) != charge.reserved):
            # Written even at no difference: the row uses the reservation's one refund (budgets.charge).
            access.budgets.charge(session, budgets, float(tokens) - charge.reserved, settles=charge.rows)
        if event is not None:
            record_audit(session, **event)

    if audit and not budgets:
        # An audit event alone (an expert's or operator's request) is held with the events of
        # the requests in flight beside it, and committed with them as one INSERT (Held).
        return access.audits.add(event)
    if audit:
        return access.writes.submit(settle)
    # Without an audit event the settlement only gives back what the reservation over-counted
    # (a text's bytes bound its tokens): queued, not awaited, so the answer leaves one commit
    # sooner (and under another principal's flood, one group's commit sooner). The writes'
    # thread takes its queue in order, so this principal's next admission counts it; were it
    # lost, the budget would only be charged the whole reservation.
    charge.settled = True
    access.writes.submit(settle).add_done_callback(_log_failed("settle"))
    return None


def _audit_many(session, events: list[dict[str, Any]]) -> list[None]:
    """Several requests' audit events (:func:`_settle`) as one INSERT: the rows
    :func:`keys.audit.record_audit` writes (its checks hold: actor and action are set, the
    details are plain JSON with no secret's name), one statement instead of an ORM flush and
    a savepoint each."""
    now = clock.utcnow()
    session.connection().execute(_AUDIT_INSERT, [
        {"occurred_at": now, "actor": e["actor"][:ACTOR_LENGTH], "action": e["action"], "tenant_id": e["tenant_id"],
         "key_id": None, "details": e["details"]} for e in events])
    return [None] * len(events)


_AUDIT_INSERT = AuditEvent.__table__.insert()


_AUDIT_ACTIONS = {EXPERT: "detection.expert", OPERATOR: "detection.operator"}
"""Full-result tiers: every request is an audit event (token, tokens scored, verdict; no text)."""


def _attributed(services) -> set[str]:
    def load() -> set[str]:
        with services.store.transaction(write=False) as session:
            return set(session.scalars(select(Tenant.name).where(Tenant.public_attribution)))
    return services.key_cache.get_or_load(("public_attribution",), load)


def _public_identity(who: Principal) -> Identity:
    # The core's identity for a public check: every tenant's keys and ledger, as for an
    # expert (the answer is then cut down to the public tier's).
    return Identity(token_id=f"public:{who.key}", tenant_id=None, tenant=None, admin=False, kind="public")


@dataclass
class Answer:
    """A tier's answer, and the write that must commit before it leaves (:func:`answered`)."""

    shown: dict[str, Any]
    write: Future | asyncio.Future | None = None
    """The request's audited settlement, submitted or held (service.access.group_commit), or None."""
    charge: Charge | None = None
    refund: Callable[[], None] | None = None


async def answered(answer: Answer) -> dict[str, Any]:
    """``answer.shown`` once its audited write committed (a failed write: its HTTP error, and
    the reservation given back). The route awaits this after the principal's lane: the commit
    (an fsync on SQLite) is then shared with the writes of the requests that ran meanwhile
    instead of holding the principal's next detection (issue 30 item 5)."""
    if answer.write is None:
        return answer.shown
    try:
        await _write_done(answer.write)
        answer.charge.settled = True  # only once committed: a settle that failed leaves the refund
    except BaseException:  # a cancelled request too: its admission committed all the same
        if not answer.charge.settled and (answer.charge.reserved or answer.charge.evidence):
            answer.refund()
        raise
    return answer.shown


async def answer(services, identity: Identity | None, body: DetectBody, who: Principal, *,
                 inline: bool) -> Answer:
    """The tier's answer to ``body`` (:class:`Answer`: awaited through :func:`answered`).
    ``inline``: a small body, detected on the event loop under one of the principal's slots;
    else every CPU-bound step runs in a worker thread (the route holds the principal's slot
    around this whole call)."""
    settings = services.settings
    access = access_of(services)
    tier = who.tier
    check_size(settings, tier, body)
    evidence = _check_options(tier, identity, body, services.settings.signed_max_p)
    _check_rate(services, identity, who)
    # One tokenisation of the text's forms for the probe sketch, the public count and the core.
    tokens = detection.Tokenised(services.engine.tokenizer()) if body.text is not None and tier == PUBLIC else None
    charge = await _admit(services, access, who, body, evidence, inline, identity, tokens)
    refund = partial(_refund, access, who, services.settings, charge)
    try:
        if tier == PUBLIC:
            return Answer(await _public(services, access, who, body, inline, charge, tokens))
        # The tenant tier keeps the core's signature and tokenisation for now: with them shared,
        # tests/service/access/test_guard_attacks.py's own-generation case failed 3 runs in 9 (0 in
        # 8 before), cause not found by the deadline (bench/results/detect-perf30b.md).
        full = await _core(access, who, inline, detection.detect, services, identity, body)
        key_state = (full.get("key") or {}).get("state")
        if tier in (EXPERT, OPERATOR):
            shown = shape.full_answer(full, tier)
            if shown.get("report") is not None:  # the core's report states the full result; the policy may re-sign it
                shown["report"] = await _call(inline, shape.full_report, services, full)
        else:
            shown = shape.tenant_answer(full, evidence=evidence)
            shown["report"] = shape.resign(services, full.get("report"), shown, tier, key_state)
        # Submitted last, once nothing of this request can fail but its write (awaited by answered()).
        write = _settle(services, access, who, identity, int(full.get("total_tokens") or 0), evidence=evidence,
                        verdict="watermarked" if full.get("watermarked") else "not_watermarked", charge=charge)
    except BaseException:  # a cancelled request too (CancelledError): its admission committed all the same
        if not charge.settled and (charge.reserved or charge.evidence):
            refund()
        raise
    return Answer(shown, write, charge, refund)


async def _write_done(future: Future | asyncio.Future) -> Any:
    """The submitted write's outcome; KeyStoreError -> its HTTP error."""
    try:
        return await (future if isinstance(future, asyncio.Future) else asyncio.wrap_future(future))
    except KeyStoreError as exc:
        raise store_error(exc) from None


def _log_failed(what: str) -> Callable[[Any], None]:
    def failed(future) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.warning("could not %s a detection's reservation: %s", what, type(future.exception()).__name__)
    return failed


def _refund(access: Access, who: Principal, settings, charge: Charge) -> None:
    """Give back the reservation (and the evidence use) of a request that failed (or was
    cancelled) before its answer left: queued, not awaited (a cancelled task may not await
    again), ahead of any later write of this process."""
    budgets = charge.budgets if charge.reserved else []
    evidence_budget = [Budget(f"evidence:{who.key}", settings.evidence_per_day)] if charge.evidence else []
    charge.settled = True

    def refund(session) -> None:
        if budgets:
            access.budgets.charge(session, budgets, -charge.reserved, settles=charge.rows)
        if evidence_budget:
            access.budgets.charge(session, evidence_budget, -1.0, settles=charge.evidence_rows)

    access.writes.submit(refund).add_done_callback(_log_failed("refund"))


def _check_rate(services, identity: Identity | None, who: Principal) -> None:
    wait = services.detect_wait(identity.token_id if identity is not None else f"public:{who.key}")
    if wait > 0:
        services.metrics.rate_limited.labels("/v1/detect").inc()
        raise RateLimited(f"detection rate limit reached for this token; retry in {wait:.1f} s",
                          headers={"Retry-After": str(max(1, round(wait + 0.5)))})


async def _core(access: Access, who: Principal, inline: bool, fn: Callable[..., Any], *args: Any) -> Any:
    if inline:
        # Synchronous on the loop: the slot bounds this principal's concurrent work exactly
        # as a thread's would (a principal whose large bodies hold every slot waits here too).
        with access.slots.hold(who.name):
            return fn(*args)
    # A principal over its share lets others' detections in flight finish first (service.access.lanes).
    await access.lanes.defer(who.name)
    pool = offload.offload_of(args[0]) if offload.offloadable(fn) else None
    if pool is not None:  # its own process: its CPU does not hold this one's interpreter (service.access.offload)
        return await pool.detect(fn, *args)
    return await asyncio.to_thread(fn, *args)


async def _public(services, access: Access, who: Principal, body: DetectBody, inline: bool,
                  charge: Charge, tokenised: detection.Tokenised | None = None) -> dict[str, Any]:
    settings = services.settings
    tokenised = tokenised if tokenised is not None else detection.Tokenised(services.engine.tokenizer())
    pool = None if inline else offload.offload_of(services)
    if pool is not None:  # a large text's count in the worker (the core there tokenises it itself)
        tokens = await pool.count_tokens(services, body.text)
    else:
        tokens = len((await _call(inline, tokenised.encode, body.text))[0])
    if tokens < settings.public_min_tokens:
        _settle(services, access, who, None, tokens, evidence=False, verdict="too_short", charge=charge)
        shown = shape.public_answer(None, tokens=tokens, min_tokens=settings.public_min_tokens,
                                    provider=settings.provider_name, attributed=set())
        shown["report"] = await _call(inline, _too_short_report, services, body, shown, tokenised)
        return shown
    full = await _core(access, who, inline, partial(detection.detect, sign=False, tokens=tokenised),
                       services, _public_identity(who), body)
    tokens = int(full.get("total_tokens") or tokens)
    _settle(services, access, who, None, tokens, evidence=False,
            verdict="watermarked" if full.get("watermarked") else "not_watermarked", charge=charge)
    attributed = await _call(inline, _attributed, services)
    shown = shape.public_answer(full, tokens=tokens, min_tokens=settings.public_min_tokens,
                                provider=settings.provider_name, attributed=attributed)
    shown["report"] = shape.resign(services, full.get("report"), shown, PUBLIC, (full.get("key") or {}).get("state"))
    return shown


def _too_short_report(services, body: DetectBody, shown: dict[str, Any],
                      tokenised: detection.Tokenised | None = None) -> dict[str, Any] | None:
    """A signed report of a text the public tier did not test: verdict ``not_tested`` (never
    ``not_watermarked``: nothing was tested; issue 31), the subject's hashes, and why."""
    from service.provenance import report_scope, report_settings, report_statement

    config = detection.detector_config(body)
    tokenised = tokenised if tokenised is not None else detection.Tokenised(services.engine.tokenizer())
    token_ids = tokenised.encode(body.text)[0]
    candidates = services.detection_candidates(None)
    statement = report_statement(shown, text=body.text, token_ids=token_ids,
                                 scope=report_scope(candidates, keys_of="all_tenants", tenant=None),
                                 settings=report_settings(config, normalize=body.normalize))
    statement["verdict_text"] = shown["verdict_text"]
    statement["verdict"], statement["basis"] = shape.NOT_TESTED, []
    statement["scope"] = {"keys_of": "provider", "tenant": None}
    statement["access"] = {"tier": PUBLIC, "confidence": "none"}
    return services.sign(shape.policy(statement, max_p=settings_max_p(services), key_state=None))


def settings_max_p(services) -> float:
    return services.settings.signed_max_p
