"""Generation as a plain function: pick the tenant's key, run the engine, record provenance.

The key is always chosen here, from the authenticated tenant; a client never supplies
key material. Nothing leaves the server unrecorded: a non-streaming request writes its
ledger record before the text is returned (a failed record withholds the text); a stream
commits its ``started`` entry before its first token, checkpoints as it goes and ends in a
``finished`` entry whatever ends it (see :func:`stream`).

Ledger writes are committed in groups (``Services.ledger_writes``, one thread per process,
service.access.group_commit): the writes waiting at a moment share one transaction, each
in its own savepoint, and each request awaits its own write's commit, so a stream's entry
still exists before the tokens it covers leave, while 256 streams' entries cost a few
commits rather than one each (and no request holds a worker thread while it waits).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from keys import clock
from ledger import grouped, kgrams
from ledger.log.faults import LogBlocked
from keys.errors import KeyRevoked, KeyStoreError
from ledger.entries import (CHECKPOINT_TOKENS, GenerationEntry, checkpoint_generation, finish_generation,
                            record_generation, start_generation)
from service.auth import Identity, resolve_tenant
from service.engines.base import (Delta, EngineBusy, EngineFailure, Finished, GenerationRequest, RouteCounts,
                                  WatermarkPlan)
from service.errors import BadRequest, Conflict, Forbidden, Unavailable, Unprocessable
from service.http_errors import store_error
from service.limits import GenerationLease
from service.state import Services
from ledger.read import SALT_DETAIL
from watermark.key import WatermarkKey
from watermark.processing import validate_sampling
from watermark import prf
from watermark.salt import distinct_salts, salt_for

log = logging.getLogger("hallmark.generation")


@dataclass(frozen=True)
class GenerateParams:
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    watermark: bool = True
    tenant: str | None = None
    salt: int | None = None
    """A `diverse` key's salt for this generation (the OpenAI routes' ``n`` choices give
    each its own); None: from ``seed`` when given, else random (watermark.salt.salt_for)."""


@dataclass(frozen=True)
class Outcome:
    generation_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    watermark: dict[str, Any] | None
    model: str
    routes: RouteCounts = field(default_factory=RouteCounts)
    """How many tokens each route produced (key A, key B, plain, greedy)."""
    unwatermarked_reason: str | None = None
    """Why the output is not (fully) watermarked, in the ledger's words (None: it is)."""
    ledger: dict[str, Any] | None = None
    """The ledger entry written for this output: ``{"seq": int, "entry_hash": str}``."""
    receipt: dict[str, Any] | None = None
    """The signed receipt (:mod:`ledger.receipts`); None only when no signing key exists."""

    def to_dict(self) -> dict[str, Any]:
        return {"generation_id": self.generation_id, "text": self.text, "token_ids": list(self.token_ids),
                "finish_reason": self.finish_reason, "model": self.model,
                "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.token_ids),
                          "total_tokens": self.prompt_tokens + len(self.token_ids)},
                "watermark": self.watermark, "ledger": self.ledger, "receipt": self.receipt}


@dataclass(frozen=True)
class _Prepared:
    request: GenerationRequest
    tenant_id: str
    plan: WatermarkPlan | None
    spec: Any
    reason: str | None


def _prepare(services: Services, identity: Identity, params: GenerateParams) -> _Prepared:
    settings = services.settings
    try:
        validate_sampling(params.temperature, params.top_k, params.top_p)
    except ValueError as exc:
        raise Unprocessable(str(exc)) from None
    max_tokens = settings.default_max_tokens if params.max_tokens is None else params.max_tokens
    if max_tokens < 1:
        raise Unprocessable("max_tokens must be >= 1")
    if max_tokens > settings.max_tokens_cap:
        raise Unprocessable(f"max_tokens {max_tokens} exceeds this server's cap of {settings.max_tokens_cap}")
    if params.seed is not None and not 0 <= params.seed < 2**64:
        raise Unprocessable("seed must be an integer in [0, 2**64)")
    if len(params.stop) > 8 or any(not s or len(s) > 200 for s in params.stop):
        raise Unprocessable("stop: at most 8 non-empty strings of at most 200 characters")
    tenant_id, _ = resolve_tenant(services, identity, params.tenant)
    if tenant_id is None:
        raise Forbidden("an admin token must name the tenant to generate for ('tenant')")
    if params.prompt_ids is not None:
        prompt_ids = tuple(int(t) for t in params.prompt_ids)
    elif params.prompt is not None:
        prompt_ids = tuple(services.engine.tokenizer().encode(params.prompt))
    else:
        raise BadRequest("give a prompt")
    if not prompt_ids:
        raise Unprocessable("the prompt is empty")
    if len(prompt_ids) > settings.max_prompt_tokens:
        raise Unprocessable(f"the prompt has {len(prompt_ids)} tokens; this server accepts at most "
                            f"{settings.max_prompt_tokens}")
    plan, spec, reason = None, None, None
    if not params.watermark:
        if not (settings.allow_opt_out or identity.admin):
            raise Forbidden("this deployment requires watermarking: 'watermark': false is not allowed")
        reason = "opt_out"
    elif params.temperature == 0:
        reason = "temperature_0"
    else:
        try:
            stored = services.active_key(tenant_id)
        except KeyStoreError as exc:  # no active key: 409, not retryable; a database fault: 503
            raise store_error(exc) from None
        plan = WatermarkPlan(key=_generation_key(services, stored.material, stored.key_id, params, prompt_ids),
                             key_id=stored.key_id,
                             version=stored.version, fingerprint=stored.fingerprint)
        spec = stored.spec
    request = GenerationRequest(
        request_id=uuid.uuid4().hex, prompt_ids=prompt_ids, max_tokens=max_tokens,
        temperature=float(params.temperature), top_p=float(params.top_p), top_k=int(params.top_k),
        seed=params.seed, stop=tuple(params.stop), watermark=plan)
    try:
        services.engine.check(request)
    except ValueError as exc:
        raise Unprocessable(str(exc)) from None
    return _Prepared(request=request, tenant_id=tenant_id, plan=plan, spec=spec, reason=reason)


def _generation_key(services: Services, key: WatermarkKey, key_id: str, params: GenerateParams,
                    prompt_ids: tuple[int, ...]) -> WatermarkKey:
    """The key this generation runs under: a `diverse` key with the generation's salt (given,
    else from the seed, else the prompt's next salt in turn: watermark.salt)."""
    if not key.spec.salted:  # deterministic, or `head` diversity (its stream varies the text)
        return key
    if params.salt is not None:
        salt = params.salt
    elif params.seed is not None:
        salt = salt_for(params.seed)
    else:
        salt = services.salts.take(key_id, prompt_ids)
    return key.with_salt(salt)


def _salt_details(prepared: _Prepared, details: dict | None) -> dict | None:
    """The ledger entry's ``details`` with the generation's salt (ledger.read.SALT_DETAIL)."""
    salt = prepared.plan.key.salt if prepared.plan is not None else None
    if salt is None:
        return details
    return {**(details or {}), SALT_DETAIL: salt}


def _watermark_dict(prepared: _Prepared, done_tokens: int, watermarked: int, key_state: str | None) -> dict | None:
    plan = prepared.plan
    if plan is None:
        return None
    share = watermarked / done_tokens if done_tokens else 0.0
    out = {"key_id": plan.key_id, "version": plan.version, "fingerprint": plan.fingerprint,
           "key_state": key_state, "algorithm": prepared.spec.algorithm, "spec": prepared.spec.public_dict(),
           "watermarked_tokens": watermarked, "watermarked_share": share}
    if plan.key.salt is not None:
        out["salt"] = plan.key.salt
    if prepared.spec.key_bits != 64:  # a 64-bit Philox key's response reads as before (detector.result.KeyInfo)
        out["prf"], out["key_bits"] = prepared.spec.prf, prepared.spec.key_bits
    return out


def _with_verification(watermark: dict | None, details: dict | None) -> dict | None:
    if watermark is not None and details and "watermark_verified" in details:
        watermark["verification"] = {"log10_p": details["watermark_log10_p"],
                                     "verified": details["watermark_verified"]}
    return watermark


def _outcome(services: Services, prepared: _Prepared, done: Finished, entry: GenerationEntry) -> Outcome:
    plan = prepared.plan
    services.metrics.record_generation(services.engine.name, done, plan is not None)
    if prepared.reason:
        services.metrics.unwatermarked.labels(prepared.reason).inc()
    watermarked = done.routes.watermarked if plan else 0
    receipt = services.receipt_for(entry, fingerprint=plan.fingerprint if plan else None)
    return Outcome(generation_id=prepared.request.request_id, text=done.text, token_ids=done.token_ids,
                   finish_reason=done.finish_reason, prompt_tokens=done.prompt_tokens,
                   watermark=_with_verification(_watermark_dict(prepared, len(done.token_ids), watermarked,
                                                                entry.key_state), entry.details),
                   model=services.engine.model_name, receipt=receipt,
                   ledger={"seq": entry.seq, "entry_hash": entry.entry_hash}, routes=done.routes,
                   unwatermarked_reason=_unwatermarked_reason(prepared, done.routes.plain))


VERIFY_MIN_TOKENS = 16
VERIFY_LOG10_P = -3.0
"""A remote output of at least this many watermarked tokens must reach p <= 1e-3 under its key."""


def _verification(services: Services, prepared: _Prepared, token_ids: tuple[int, ...] | list[int],
                  watermarked: int) -> dict[str, Any] | None:
    """A remote engine's output, checked with the detector before it is recorded (a vLLM
    server without the plugin would return unwatermarked text): the measured log10 p, and
    whether it verifies. Local engines sample in this process and are not re-checked."""
    plan = prepared.plan
    if plan is None or services.engine.name == "local" or not token_ids:
        return None
    from detector.detect import detect
    from detector.result import Candidate

    log10_p = float(detect(list(token_ids), [Candidate.inline(plan.key)]).log10_p_value)
    verified: bool | None = log10_p <= VERIFY_LOG10_P if watermarked >= VERIFY_MIN_TOKENS else None
    if verified is False:
        services.metrics.watermark_unverified.labels(services.engine.name).inc()
        log.warning("generation %s: watermark_unverified (log10 p %.2f over %d tokens) from engine %s",
                    prepared.request.request_id, log10_p, len(token_ids), services.engine.name)
    return {"watermark_log10_p": round(max(log10_p, -1e300), 6), "watermark_verified": verified}


async def _verified(services: Services, prepared: _Prepared, done: Finished) -> dict[str, Any] | None:
    """:func:`_verification` of a finished generation, in a worker thread where it runs the
    detector (remote engines)."""
    if services.engine.name == "local":
        return None
    return await asyncio.to_thread(_verification, services, prepared, done.token_ids,
                                   done.routes.watermarked if prepared.plan else 0)


def _unwatermarked_reason(prepared: _Prepared, plain: int) -> str | None:
    return prepared.reason or ("dedup" if prepared.plan and plain else None)


async def _written(services: Services, write, batch=None) -> GenerationEntry:
    """``write(session)``'s entry, once the ledger group it joined has committed (``batch``:
    how to write it with others at once, GroupCommit.submit)."""
    return await asyncio.wrap_future(services.ledger_writes.submit(write, batch))


async def _record(services: Services, prepared: _Prepared, done: Finished, started_at=None) -> Outcome:
    """One ``finished`` entry for a non-streaming generation (nothing has left yet), which
    records when it started (``started_at``) beside when it finished. A key revoked while it
    generated withholds the output instead of recording it."""
    plan = prepared.plan
    details = await _verified(services, prepared, done)

    def write(session) -> GenerationEntry:
        return record_generation(
            session, tenant_id=prepared.tenant_id, key_id=plan.key_id if plan else None,
            key_version=plan.version if plan else None, engine=services.engine.name,
            model=services.engine.model_name, spec=prepared.spec, prompt_tokens=done.prompt_tokens,
            watermarked_tokens=done.routes.watermarked if plan else 0,
            unwatermarked_reason=_unwatermarked_reason(prepared, done.routes.plain),
            output_text=done.text, token_ids=done.token_ids, finish_reason=_engine_reason(done.finish_reason),
            generation_id=prepared.request.request_id, refuse_revoked_key=True,
            details=_salt_details(prepared, details), kgram_set=_kgram_set(prepared, done.token_ids),
            started_at=started_at)

    try:
        entry = await _written(services, write)
    except KeyRevoked:
        log.warning("generation %s withheld: its key was revoked while it generated", prepared.request.request_id)
        raise Unavailable("the watermark key was revoked while this generation ran, so the output is "
                          "withheld; retry (the tenant's new active key will be used)") from None
    except KeyStoreError as exc:
        raise _unrecorded(services, exc, prepared.request.request_id, "the output is withheld") from None
    _logged(services, entry)
    return await asyncio.to_thread(_outcome, services, prepared, done, entry)


def _kgram_set(prepared: _Prepared, token_ids) -> kgrams.KgramSet | None:
    """The k-grams of watermarked output, hashed, recorded and committed to with its
    finished entry (:mod:`ledger.kgrams`, :mod:`ledger.log.leaves`): lets detection match an edited
    copy to this generation, and only as the log holds it."""
    plan = prepared.plan
    if plan is None or plan.key_id is None:
        return None
    return kgrams.kgram_set(plan.key_id, plan.key.secret, token_ids)


def _logged(services: Services, entry: GenerationEntry) -> None:
    """Count a committed append toward the next published checkpoint."""
    if entry.log is not None:
        services.store_faults.appended()
        services.logged(entry.log.size)


def _unrecorded(services: Services, exc: KeyStoreError, generation_id: str, what: str) -> Unavailable:
    """The 503 for a record that could not be written (``what`` says what is withheld), with
    the cause's code (``ledger_blocked``, ``database_unavailable``, ...) and Retry-After."""
    log.error("provenance record failed for generation %s: %s", generation_id, exc.user_message)
    if isinstance(exc, LogBlocked):
        services.store_faults.log_blocked(exc)
    cause = store_error(exc)
    reason = ("the transparency log is blocked by a row this gateway did not write (the operator must run "
              "`hallmark ledger repair`)" if isinstance(exc, LogBlocked) else "the provenance record could not be "
              "written")
    return Unavailable(f"{reason}, so {what}; retry later", code=cause.code if cause.status == 503 else "store_error",
                       headers={"Retry-After": "30" if isinstance(exc, LogBlocked) else "1"})


def _engine_reason(reason: str) -> str:
    return reason if reason in ("stop", "length") else "stop"


async def _admitted(services: Services, identity: Identity, params: GenerateParams) -> tuple[_Prepared, GenerationLease]:
    """Validate and prepare (in a worker thread: key and tenant look-ups may query the
    database), then take a place in the tenant's limits (429 beyond them)."""
    prepared = await asyncio.to_thread(_prepare, services, identity, params)
    lease = await services.tenant_limits.admit(prepared.tenant_id, prepared.request.max_tokens)
    return prepared, lease


async def _leased(events: AsyncIterator[Delta | Outcome], lease: GenerationLease) -> AsyncIterator[Delta | Outcome]:
    """``events``, giving the lease back (with the tokens sent) however the stream ends."""
    sent = 0
    try:
        async for event in events:
            if isinstance(event, Delta):
                sent += len(event.token_ids)
            yield event
    finally:
        lease.release(sent)
        await events.aclose()


async def generate(services: Services, identity: Identity, params: GenerateParams) -> Outcome:
    prepared, lease = await _admitted(services, identity, params)
    try:
        outcome = await _generate(services, prepared)
    except BaseException:
        lease.release(0)
        raise
    lease.release(len(outcome.token_ids))
    return outcome


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of the ``index``-th of a request's choices: the request's own for the first
    (so n=1 and the first of n agree), a derived one for the others, so that every random
    draw (salt aside, which :func:`watermark.salt.distinct_salts` picks) differs per choice."""
    if seed is None or index == 0:
        return seed
    return prf.derive_key(seed, f"hallmark_choice/{index}")


def _check_choices(services: Services, identity: Identity, params: GenerateParams, n: int) -> None:
    """Refuse ``n`` > 1 where every choice would repeat one text: a watermarked request
    under a `deterministic` key (409: the tenant's key decides, not the request)."""
    if n == 1 or not params.watermark or params.temperature == 0:
        return
    tenant_id, _ = resolve_tenant(services, identity, params.tenant)
    if tenant_id is None:
        return  # _prepare refuses it
    try:
        stored = services.active_key(tenant_id)
    except KeyStoreError:
        return  # _prepare maps it
    if stored.spec.mode != "diverse":
        raise Conflict(f"n={n} needs a key in mode 'diverse': the tenant's active key is "
                       f"'{stored.spec.mode}' (vLLM's scheme), under which every choice of one prompt "
                       "repeats the same text; send one request, or rotate to a diverse key "
                       "(`hallmark keys rotate --mode diverse`)", code="n_needs_diverse_key")


async def generate_choices(services: Services, identity: Identity, params: GenerateParams, n: int) -> list[Outcome]:
    """``n`` generations of one request (OpenAI's ``n``), run together: each its own
    generation (ledger entry, receipt) under its own salt (distinct across the choices) and
    its own seed (:func:`choice_seed`), so a seeded request reproduces all of them. Unseeded,
    the choices take the prompt's next n salts in turn (distinct for n <= 16)."""
    if n == 1:
        return [await generate(services, identity, params)]
    await asyncio.to_thread(_check_choices, services, identity, params, n)
    salts = distinct_salts(params.seed, n) if params.seed is not None else [None] * n
    return list(await asyncio.gather(*(
        generate(services, identity, dataclasses.replace(params, seed=choice_seed(params.seed, i), salt=salts[i]))
        for i in range(n))))


async def _generate(services: Services, prepared: _Prepared) -> Outcome:
    started_at = clock.utcnow()
    done = None
    try:
        async for event in services.engine.generate(prepared.request):
            if isinstance(event, Finished):
                done = event
    except (EngineBusy, EngineFailure) as exc:
        raise Unavailable(str(exc)) from None
    if done is None:
        raise Unavailable("the engine stopped before finishing the generation")
    return await _record(services, prepared, done, started_at)


def _failure_reason(exc: BaseException) -> str:
    """The ledger's finish reason for an exception that ended a stream."""
    try:
        import httpx

        from service.engines.vllm.remote import RemoteError
    except ImportError:  # pragma: no cover - httpx is a dependency
        return "engine_failure"
    if isinstance(exc, (RemoteError, httpx.HTTPError)):
        return "remote_error"
    return "engine_failure"


@dataclass
class Stream:
    """A started stream: its generation id (known, and recorded, before the first token)
    and its events. Closing a stream that never ran (the client left before the response
    began) still closes its record."""

    generation_id: str
    events: AsyncIterator[Delta | Outcome]
    on_unstarted_close: Any = None
    begun: bool = False

    def __aiter__(self) -> AsyncIterator[Delta | Outcome]:
        self.begun = True
        return self.events.__aiter__()

    async def aclose(self) -> None:
        if not self.begun and self.on_unstarted_close is not None:
            self.begun = True
            self.on_unstarted_close()
        await self.events.aclose()


class _Progress:
    """What a stream has sent, and how far the ledger covers it."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.routes = RouteCounts()
        self.covered = 0

    def _write(self, prepared: _Prepared, finish_reason: str | None, details: dict | None):
        """The entry that covers everything sent so far, as a write for the ledger's group."""
        plan = prepared.plan
        values = dict(generation_id=prepared.request.request_id, tenant_id=prepared.tenant_id,
                      output_text="".join(self.text), token_ids=list(self.token_ids),
                      watermarked_tokens=min(self.routes.watermarked, len(self.token_ids)) if plan else 0,
                      unwatermarked_reason=_unwatermarked_reason(prepared, self.routes.plain))
        if finish_reason is None:
            kind, kwargs = grouped.CHECKPOINT, values
        else:
            kind, kwargs = grouped.FINISHED, dict(values, finish_reason=finish_reason,
                                                  details=_salt_details(prepared, details),
                                                  kgram_set=_kgram_set(prepared, values["token_ids"]))

        def write(session) -> GenerationEntry:
            if finish_reason is None:
                return checkpoint_generation(session, **kwargs)
            return finish_generation(session, **kwargs)

        return write, (grouped.append_many, (kind, kwargs)), len(values["token_ids"])

    def write(self, services: Services, prepared: _Prepared, *, finish_reason: str | None,
              details: dict | None = None) -> GenerationEntry:
        """The entry, committed (blocking: for threads)."""
        write, batch, covered = self._write(prepared, finish_reason, details)
        entry = services.ledger_writes.submit(write, batch).result()
        self.covered = covered
        _logged(services, entry)
        return entry

    async def write_async(self, services: Services, prepared: _Prepared, *, finish_reason: str | None,
                          details: dict | None = None) -> GenerationEntry:
        """The entry, committed (awaited on the event loop: no worker thread waits)."""
        write, batch, covered = self._write(prepared, finish_reason, details)
        entry = await _written(services, write, batch)
        self.covered = covered
        _logged(services, entry)
        return entry

    def close_quietly(self, services: Services, prepared: _Prepared, finish_reason: str) -> None:
        try:
            self.write(services, prepared, finish_reason=finish_reason)
        except Exception:  # noqa: BLE001 - logged; recovery on restart closes it as interrupted
            log.exception("could not write the final ledger entry of generation %s (%s)",
                          prepared.request.request_id, finish_reason)


async def _start(services: Services, prepared: _Prepared) -> None:
    plan = prepared.plan
    kwargs = dict(tenant_id=prepared.tenant_id, key_id=plan.key_id if plan else None,
                  key_version=plan.version if plan else None, engine=services.engine.name,
                  model=services.engine.model_name, spec=prepared.spec,
                  prompt_tokens=len(prepared.request.prompt_ids), unwatermarked_reason=prepared.reason,
                  generation_id=prepared.request.request_id, details=_salt_details(prepared, None))

    def write(session) -> GenerationEntry:
        return start_generation(session, **kwargs)

    try:
        entry = await _written(services, write, (grouped.append_many, (grouped.STARTED, kwargs)))
    except KeyStoreError as exc:
        raise _unrecorded(services, exc, prepared.request.request_id, "nothing is generated") from None
    _logged(services, entry)


async def stream(services: Services, identity: Identity, params: GenerateParams) -> Stream:
    """Deltas as they come, then the recorded :class:`Outcome`.

    Validation happens first, then the ledger's ``started`` entry is committed, so a bad
    request or an unwritable ledger fails before any streaming starts. While streaming, a
    ``checkpoint`` entry is committed before a delta would leave more than
    :data:`~ledger.entries.CHECKPOINT_TOKENS` sent tokens uncovered, so a process killed at any
    point leaves a record of all but at most that many of the tokens it sent. Whatever ends
    the stream (the engine's end, an engine or remote failure, the deadline, the client
    leaving) writes the ``finished`` entry with its reason."""
    prepared, lease = await _admitted(services, identity, params)
    try:
        await _start(services, prepared)
    except BaseException:
        lease.release(0)
        raise
    timeout = services.settings.generation_timeout_s

    async def events() -> AsyncIterator[Delta | Outcome]:
        progress = _Progress()
        done: Finished | None = None
        iterator = services.engine.generate(prepared.request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        finished = False
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        event = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    finished = True
                    await asyncio.to_thread(progress.close_quietly, services, prepared, "timeout")
                    raise Unavailable(f"the generation ran past this server's limit of {timeout:g} s; "
                                      "the text sent so far is recorded") from None
                if isinstance(event, Finished):
                    done = event
                    break
                ahead = len(progress.token_ids) + len(event.token_ids) - progress.covered
                if ahead > CHECKPOINT_TOKENS:
                    if len(event.token_ids) > CHECKPOINT_TOKENS:  # cover this large delta before it leaves
                        progress.text.append(event.text)
                        progress.token_ids.extend(event.token_ids)
                        progress.routes = event.routes or progress.routes
                        await progress.write_async(services, prepared, finish_reason=None)
                        yield event
                        continue
                    await progress.write_async(services, prepared, finish_reason=None)
                progress.text.append(event.text)
                progress.token_ids.extend(event.token_ids)
                progress.routes = event.routes or progress.routes
                yield event
        except (GeneratorExit, asyncio.CancelledError):
            # The client left mid-stream: close its record (a thread, since nothing can be
            # awaited here any more; a restart's recovery closes it if this fails).
            if not finished:
                finished = True
                threading.Thread(target=progress.close_quietly,
                                 args=(services, prepared, "client_disconnect")).start()
            raise
        except Unavailable:
            raise
        except KeyStoreError as exc:
            # A checkpoint could not be written: stop sending what would go unrecorded.
            finished = True
            failure = _unrecorded(services, exc, prepared.request.request_id, "the stream stops here")
            await asyncio.to_thread(progress.close_quietly, services, prepared, "engine_failure")
            raise failure from None
        except Exception as exc:  # noqa: BLE001 - every engine or remote failure ends in a record
            finished = True
            reason = _failure_reason(exc)
            log.warning("generation %s ended by %s: %s", prepared.request.request_id, reason, type(exc).__name__)
            await asyncio.to_thread(progress.close_quietly, services, prepared, reason)
            message = str(exc) if isinstance(exc, (EngineBusy, EngineFailure)) else (
                "the remote vLLM server failed mid-stream" if reason == "remote_error" else
                "the engine failed mid-stream")
            raise Unavailable(f"{message}; the text sent so far is recorded") from None
        finally:
            await iterator.aclose()
        if done is None:
            await asyncio.to_thread(progress.close_quietly, services, prepared, "engine_failure")
            raise Unavailable("the engine stopped before finishing the generation; the text sent so far is recorded")
        outcome = await _finish(services, prepared, done, progress)
        yield outcome

    def never_ran() -> None:
        threading.Thread(target=_Progress().close_quietly, args=(services, prepared, "client_disconnect")).start()

    leased = _leased(events(), lease)
    weakref.finalize(leased, lease.release, 0)  # a stream never started still gives its place back
    return Stream(generation_id=prepared.request.request_id, events=leased, on_unstarted_close=never_ran)


async def _finish(services: Services, prepared: _Prepared, done: Finished, progress: _Progress) -> Outcome:
    progress.text[:] = [done.text]
    progress.token_ids[:] = list(done.token_ids)
    progress.routes = done.routes
    details = await _verified(services, prepared, done)
    try:
        entry = await progress.write_async(services, prepared, finish_reason=_engine_reason(done.finish_reason),
                                           details=details)
    except KeyStoreError as exc:
        raise _unrecorded(services, exc, prepared.request.request_id,
                          "the stream's record stops at its last checkpoint") from None
    return await asyncio.to_thread(_outcome, services, prepared, done, entry)
