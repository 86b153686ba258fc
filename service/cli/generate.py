"""``hallmark generate``: watermarked generation from the command line, with provenance.

Every prompt goes through :func:`service.generation.generate`, the gateway's own domain
function, all at once (one batch): it picks the tenant's active key from the store, runs
the engine and writes one ledger record per output. The key is chosen there, by the
server side, never by the caller; ``--no-watermark`` is the recorded opt-out.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

import typer

from service.cli.app import CliError, app, emit

if TYPE_CHECKING:
    from service.generation import Outcome


def _build_engine(settings):
    """The engine through the gateway's own factory (:func:`service.engines.factory.create_engine`)."""
    from service.engines.factory import create_engine

    if settings.engine == "vllm":
        from service.cli.deploy import vllm_logs_to_stderr

        vllm_logs_to_stderr()
    try:
        return create_engine(settings)
    except ValueError as exc:
        raise CliError(str(exc)) from None


async def _run(services, params: list, *, tenant: str, needs_key: bool) -> list["Outcome"]:
    """Each prompt through :func:`service.generation.generate` (key choice, engine, ledger
    record), concurrently, as the operator (an admin identity acting for the tenant)."""
    import asyncio

    from service import generation
    from service.auth import Identity

    operator = Identity(token_id="cli", tenant_id=None, tenant=None, admin=True)
    # The store's answers first (unknown tenant, no active key), before a model loads.
    tenant_id = services.tenant_id(tenant)
    if needs_key:
        services.active_key(tenant_id)
    from ledger.signing import ensure_signing_key

    with services.store.transaction() as session:  # receipts need a signing key
        ensure_signing_key(session, services.store.keyring, actor="cli:generate")
    await services.engine.start()
    try:
        return list(await asyncio.gather(*(generation.generate(services, operator, p) for p in params)))
    finally:
        await services.engine.stop()


@app.command("generate")
def generate(
    tenant: str = typer.Option(..., "--tenant", help="Tenant whose active key watermarks the output."),
    prompt: list[str] = typer.Option(..., "--prompt", metavar="TEXT", help="A prompt (repeat for a batch)."),
    engine: str = typer.Option("local", "--engine", help="Engine: local (embedded) or vllm (in-process, or --vllm-url)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Tokens to generate per prompt."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="0 is greedy and unwatermarked."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus filter (1 disables)."),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Top-k filter (0 disables)."),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, help="Seed of the ordinary random stream."),
    stop: Optional[list[str]] = typer.Option(None, "--stop", metavar="TEXT", help="Stop string (repeatable)."),
    no_watermark: bool = typer.Option(False, "--no-watermark", help="Opt out (recorded in the ledger)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model to load (local: path or bundled name; vllm: model or served name)."),
    vllm_url: Optional[str] = typer.Option(None, "--vllm-url", help="vllm: a remote `vllm serve` base URL."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Generate watermarked text for one or more prompts and record its provenance."""
    import asyncio

    from keys.errors import KeyStoreError
    from ledger.entries import hash_output
    from service.cli.store import cli_store
    from service.errors import ServiceError
    from service.generation import GenerateParams
    from service.settings import ServiceSettings
    from service.state import Services
    from watermark.processing import validate_sampling

    try:
        validate_sampling(temperature, top_k, top_p)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    from service.cli.progress import note, quiet_libraries

    if engine not in ("local", "vllm"):
        raise CliError(f"unknown engine: {engine}; expected one of local, vllm")
    # The operator's own limits, not a public server's: no caps beyond the options given.
    # Without --model the local engine runs the bundled pair (target + draft).
    settings = ServiceSettings(engine=engine, model=model or "bundled",
                               draft_model="hallmark-tiny-draft" if model is None else None, vllm_url=vllm_url,
                               max_tokens_cap=max(max_tokens, 1024), max_prompt_tokens=sys.maxsize,
                               allow_opt_out=True, tenant_max_concurrent_generations=0, tenant_tokens_per_minute=0,
                               rate_limit_backend="memory")
    quiet_libraries(as_json)
    built = _build_engine(settings)
    params = [GenerateParams(prompt=text, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                             # One seed for the batch would give equal prompts equal outputs.
                             seed=None if seed is None else (seed + index) % 2**64, stop=tuple(stop or ()),
                             watermark=not no_watermark, tenant=tenant)
              for index, text in enumerate(prompt)]
    note(f"loading the model ({built.model_name}, engine {built.name}) and generating "
         f"{len(prompt)} prompt(s)...", as_json=as_json)
    try:
        with cli_store(require_kek=True) as store:
            outcomes = asyncio.run(_run(Services(settings=settings, store=store, engine=built), params, tenant=tenant,
                                        needs_key=not no_watermark and temperature != 0.0))
    except KeyStoreError as exc:
        raise CliError(exc.user_message) from None
    except ServiceError as exc:
        raise CliError(exc.message) from None
    results = []
    watermark: dict[str, Any] | None = None
    for text, outcome in zip(prompt, outcomes):
        routes = outcome.routes
        watermark = None if outcome.watermark is None else {"tenant": tenant, **outcome.watermark}
        watermarked = routes.watermarked if watermark else 0
        results.append({
            "generation_id": outcome.generation_id, "prompt": text, "text": outcome.text,
            "token_ids": list(outcome.token_ids), "finish_reason": outcome.finish_reason,
            "prompt_tokens": outcome.prompt_tokens, "output_tokens": len(outcome.token_ids),
            "watermarked_tokens": watermarked,
            "routes": {"key_a": routes.key_a, "key_b": routes.key_b, "plain": routes.plain, "greedy": routes.greedy},
            "unwatermarked_reason": outcome.unwatermarked_reason, "watermark": watermark,
            "output_sha256": hash_output(outcome.text),
            "ledger": outcome.ledger, "receipt": outcome.receipt,
        })
    payload = {"engine": built.name, "model": built.model_name, "tenant": tenant, "generations": results}
    text = "\n\n".join(f"[{r['generation_id']}] {r['text']}\n({r['output_tokens']} tokens, "
                       f"{r['watermarked_tokens']} watermarked"
                       + (f", key {r['watermark']['key_id']} v{r['watermark']['version']})" if r["watermark"] else ")")
                       for r in results)
    emit(payload, as_json, text)
