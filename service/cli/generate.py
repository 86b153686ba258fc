"""``hallmark generate``: watermarked generation from the command line, with provenance.

Looks up the tenant's active key in the store, runs every prompt through the engine at
once (one batch), and writes one ledger record per output in one transaction. The key
is chosen here, by the server side, never by the caller; ``--no-watermark`` is the
recorded opt-out.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Optional

import typer

from keys.errors import KeyStoreError
from keys.ledger import record_generation
from keys.material import StoredKey, active_key
from keys.tenants import get_tenant
from service.cli.app import CliError, app, emit
from service.engines.base import Finished, GenerationRequest, RouteCounts, WatermarkPlan

EngineName = Literal["local", "vllm"]


@dataclass(frozen=True)
class Output:
    generation_id: str
    prompt: str
    finished: Finished


def _reason(finished: Finished, key: StoredKey | None, temperature: float) -> str | None:
    """Why an output is not (fully) watermarked, in the ledger's words."""
    routes: RouteCounts = finished.routes
    if key is None:
        return "opt_out"
    if temperature == 0.0:
        return "temperature_0"
    if routes.plain:
        return "dedup"
    return None


def _build_engine(engine: str, model: str | None, vllm_url: str | None):
    if engine == "vllm":
        from service.cli.deploy import vllm_logs_to_stderr
        from service.engines.vllm import VLLMSettings, create_vllm_engine

        vllm_logs_to_stderr()
        try:
            return create_vllm_engine(VLLMSettings(model=model, url=vllm_url))
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if engine == "local":
        from service.engines.local.engine import LocalEngine

        return LocalEngine(model or "bundled", "hallmark-tiny-draft" if model is None else None)
    raise CliError(f"unknown engine: {engine}; expected one of local, vllm")


async def _run(engine, prompts: list[str], plan: WatermarkPlan | None, max_tokens: int, temperature: float,
               top_p: float, top_k: int, seed: int | None, stop: tuple[str, ...]) -> list[Output]:
    await engine.start()
    try:
        tokenizer = engine.tokenizer()

        async def one(index: int, prompt: str) -> Output:
            generation_id = uuid.uuid4().hex
            request = GenerationRequest(
                request_id=generation_id, prompt_ids=tuple(tokenizer.encode(prompt)), max_tokens=max_tokens,
                temperature=temperature, top_p=top_p, top_k=top_k,
                # One seed for the batch would give equal prompts equal outputs.
                seed=None if seed is None else (seed + index) % 2**64, stop=stop, watermark=plan)
            finished = None
            async for event in engine.generate(request):
                if isinstance(event, Finished):
                    finished = event
            return Output(generation_id=generation_id, prompt=prompt, finished=finished)

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    finally:
        await engine.stop()


@app.command("generate")
def generate(
    tenant: str = typer.Option(..., "--tenant", help="Tenant whose active key watermarks the output."),
    prompt: list[str] = typer.Option(..., "--prompt", help="A prompt (repeat for a batch)."),
    engine: str = typer.Option("local", "--engine", help="Engine: local (embedded) or vllm (in-process, or --vllm-url)."),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="Tokens to generate per prompt."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="0 is greedy and unwatermarked."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus filter (1 disables)."),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Top-k filter (0 disables)."),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, help="Seed of the ordinary random stream."),
    stop: Optional[list[str]] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    no_watermark: bool = typer.Option(False, "--no-watermark", help="Opt out (recorded in the ledger)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model to load (local: path or bundled name; vllm: model or served name)."),
    vllm_url: Optional[str] = typer.Option(None, "--vllm-url", help="vllm: a remote `vllm serve` base URL."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Generate watermarked text for one or more prompts and record its provenance."""
    from service.cli.deploy import open_cli_store
    from watermark.processing import validate_sampling

    try:
        validate_sampling(temperature, top_k, top_p)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    built = _build_engine(engine, model, vllm_url)
    try:
        with open_cli_store() as store:
            with store.transaction(write=False) as session:
                tenant_row = get_tenant(session, name=tenant)
                key = None if no_watermark else active_key(session, store.keyring, tenant_id=tenant_row.id)
            plan = None if key is None else WatermarkPlan(key=key.material, key_id=key.key_id, version=key.version,
                                                          fingerprint=key.fingerprint)
            outputs = asyncio.run(_run(built, list(prompt), plan, max_tokens, temperature, top_p, top_k, seed,
                                       tuple(stop or ())))
            records = []
            with store.transaction() as session:
                for output in outputs:
                    done = output.finished
                    keyed = key is not None and temperature != 0.0
                    records.append(record_generation(
                        session, tenant_id=tenant_row.id, key_id=key.key_id if keyed else None,
                        key_version=key.version if keyed else None, engine=built.name, model=built.model_name,
                        spec=key.spec if keyed else None, prompt_tokens=done.prompt_tokens,
                        output_tokens=len(done.token_ids), watermarked_tokens=done.routes.watermarked,
                        unwatermarked_reason=_reason(done, key, temperature), output_text=done.text,
                        generation_id=output.generation_id))
    except KeyStoreError as exc:
        raise CliError(exc.user_message) from None
    watermark: dict[str, Any] | None = None
    if key is not None and temperature != 0.0:
        watermark = {"tenant": key.tenant, "key_id": key.key_id, "version": key.version,
                     "fingerprint": key.fingerprint, "spec": key.spec.public_dict()}
    results = []
    for output, record in zip(outputs, records):
        done = output.finished
        routes = done.routes
        results.append({
            "generation_id": record.id, "prompt": output.prompt, "text": done.text, "token_ids": list(done.token_ids),
            "finish_reason": done.finish_reason, "prompt_tokens": done.prompt_tokens,
            "output_tokens": len(done.token_ids), "watermarked_tokens": routes.watermarked,
            "routes": {"key_a": routes.key_a, "key_b": routes.key_b, "plain": routes.plain, "greedy": routes.greedy},
            "unwatermarked_reason": record.unwatermarked_reason, "watermark": watermark,
            "output_sha256": record.output_sha256,
        })
    payload = {"engine": built.name, "model": built.model_name, "tenant": tenant, "generations": results}
    text = "\n\n".join(f"[{r['generation_id']}] {r['text']}\n({r['output_tokens']} tokens, "
                       f"{r['watermarked_tokens']} watermarked"
                       + (f", key {watermark['key_id']} v{watermark['version']})" if watermark else ")")
                       for r in results)
    emit(payload, as_json, text)
