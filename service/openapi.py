"""The OpenAPI document, made to tell the truth about the running gateway.

FastAPI's default document lists only 200 and a 422 in its own ``{"detail"}`` shape, shows
authentication as an optional header parameter, and knows nothing of server-sent events
or Prometheus' text format. :func:`install` replaces it with one that has

* a bearer security scheme (the Authorize button in ``/docs``) on every route that needs a
  token, instead of an ``authorization`` header parameter;
* every status a route can answer, each error in the one error shape (``Error``);
* ``text/event-stream`` beside JSON for the generation routes (``"stream": true``) and
  ``text/plain; version=0.0.4`` for ``/metrics``;
* the deployment's own bounds: ``max_tokens`` up to this server's cap, ``top_k`` and prompt
  token ids within the served model's vocabulary.

It is built on first request, after start-up (the model's vocabulary is known then).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.schemas import MAX_TOKEN_ID, MAX_TOP_K

ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "code"],
        "properties": {
            "message": {"type": "string", "description": "What is wrong and what to do."},
            "type": {"type": "string", "description": "OpenAI's error type (invalid_request_error, ...)."},
            "code": {"type": "string", "description": "A stable snake_case code to branch on."},
        },
    }},
}

_DESCRIPTIONS = {
    400: "Bad request.",
    401: "Missing, malformed, unknown, revoked or expired bearer token.",
    403: "The token may not do this (another tenant, an admin-only route, a refused opt-out; on detection: "
         "per-token evidence without the `evidence` scope, a tenant's threshold that is not a power of ten).",
    404: "Unknown route, record, tenant or key.",
    409: "The server's state does not allow it (the tenant has no active key; the keys in scope "
         "have no keyed coin for the `routed` statistic; a generation still running has no receipt yet); "
         "not retryable (`x-should-retry: false`) until an operator acts.",
    413: "The body exceeds the server's byte limit, or the text or token count its detection limit.",
    415: "The body is not JSON (send `Content-Type: application/json`).",
    422: "Invalid request: a field's type or bounds, a prompt longer than the model's context, nothing to "
         "score (`empty_input`) or a token id outside the model's vocabulary (`token_out_of_vocabulary`).",
    429: "A rate limit (detection per token; generation concurrency or tokens per tenant; detection tokens a "
         "day, concurrent detections, the probe guard: see the error's code); see Retry-After.",
    500: "An unexpected server error (a bug); the request was not completed.",
    503: "Temporarily unavailable: the database or the engine is down or restarting; retry (Retry-After).",
}

_GENERATION = (404, 409, 429, 503)
_EXTRA: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/generate"): _GENERATION,
    ("post", "/v1/completions"): _GENERATION,
    ("post", "/v1/chat/completions"): _GENERATION,
    ("post", "/v1/detect"): (404, 409, 413, 429, 503),
    ("post", "/v1/public/detect"): (404, 413, 429, 503),
    ("get", "/v1/generations/{generation_id}"): (404, 503),
    ("get", "/v1/generations/{generation_id}/receipt"): (404, 409, 503),
    ("get", "/readyz"): (503,),
    ("get", "/v1/ledger/checkpoint"): (404, 503),
    ("get", "/v1/ledger/proof/inclusion"): (404, 503),
    ("get", "/v1/ledger/proof/inclusion-by-hash"): (404, 503),
    ("get", "/v1/ledger/proof/consistency"): (404, 503),
    ("get", "/v1/ledger/log/checkpoint"): (404, 503),
    ("get", "/v1/ledger/log/tile/{path}"): (404, 503),
}
_ADMIN = (400, 404, 409, 503)
_STREAMING = {("post", "/v1/generate"), ("post", "/v1/completions"), ("post", "/v1/chat/completions")}
_PROMETHEUS = "text/plain; version=0.0.4"
# One server-sent event (OpenAPI before 3.2: the schema describes each event of the stream).
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"},
    "data": {"type": "string", "description": "A JSON object (a delta, the final summary, or an "
                                              "error in the one error shape), or `[DONE]` last."}}}
_SECURED_HEADER = "authorization"


def _error_response(status: int) -> dict[str, Any]:
    return {"description": _DESCRIPTIONS.get(status, "Error."),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _bound(schema: Any, key: str, old: int, new: int) -> None:
    """Replace the static ceiling ``old`` of ``key`` by ``new`` throughout ``schema``."""
    if isinstance(schema, dict):
        if schema.get(key) == old:
            schema[key] = new
        for value in schema.values():
            _bound(value, key, old, new)
    elif isinstance(schema, list):
        for value in schema:
            _bound(value, key, old, new)


def _set_maximum(schemas: dict, model: str, field: str, maximum: int) -> None:
    prop = schemas.get(model, {}).get("properties", {}).get(field)
    if prop is None:
        return
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == "integer":
            option["maximum"] = maximum


DESCRIPTION = """\
Hallmark generates text that carries a keyed, distortion-free watermark, records every
generation in a hash-chained provenance ledger (also a transparency log) with a signed
receipt, and detects its watermark with exact p-values.

**Authentication.** Send an API token as `Authorization: Bearer hm_...` (the **Authorize**
button below). `make run` prints a token of the tenant `demo` once; `hallmark tokens issue`
makes others (`--admin` for the Admin routes). The public check (`POST /v1/public/detect`),
the transparency log and the operations probes need no token.

**Detection access.** What `POST /v1/detect` shows depends on the token's access tier,
named in each answer's `X-Hallmark-Access-Tier` header: a tenant token gets the verdict, the
key, p rounded up to a power of ten and the watermarked spans; per-token evidence only where
the token is allowed it; admin and expert tokens the full result.

**Errors** are JSON `{"error": {"message", "type", "code"}}` (OpenAI's shape); the message
says what to do. A 429 carries `Retry-After` in seconds.

**Elsewhere.** The page at [/ui](/ui) checks and generates in a browser; the documentation
site (`make docs`, or `docs/` in the repository) explains the concepts, the CLI and every
field of these answers.
"""
"""The API reference's top-level description (/docs shows it above the routes)."""

TAGS = [
    {"name": "Generation", "description": "Watermarked generation, recorded in the provenance ledger before "
                                          "it is returned, with a signed receipt."},
    {"name": "OpenAI-compatible", "description": "The same generation behind OpenAI's completions, chat "
                                                 "completions and model list, for OpenAI clients."},
    {"name": "Detection", "description": "Whether a text carries one of your watermarks, with exact p-values, "
                                         "spans, the ledger's matches and a signed report."},
    {"name": "Provenance", "description": "Generation records, their receipts, and the keys that sign them."},
    {"name": "Transparency log", "description": "The append-only log every ledger entry is committed to: "
                                                "checkpoints and proofs for witnesses and auditors (no token)."},
    {"name": "Account", "description": "What the presented token is."},
    {"name": "Admin", "description": "Tenants, watermark keys (rotation, revocation) and the audit log; "
                                     "admin tokens only."},
    {"name": "Operations", "description": "Probes and metrics for orchestrators and scrapers (no token)."},
]
"""The tags /docs groups the routes under, in this order, each described (every route names one)."""


def build(app: FastAPI, *, max_tokens_cap: int, vocab_size: int | None) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes,
                      tags=TAGS)
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = ERROR_SCHEMA
    components["securitySchemes"] = {"bearerAuth": {
        "type": "http", "scheme": "bearer",
        "description": "An API token (`hallmark tokens issue`): `Authorization: Bearer hm_...`."}}

    for model in ("GenerateBody", "CompletionBody", "ChatBody"):
        for field in ("max_tokens", "max_completion_tokens"):
            _set_maximum(schemas, model, field, max_tokens_cap)
    if vocab_size:
        for model in ("GenerateBody", "CompletionBody", "ChatBody"):
            _bound(schemas.get(model, {}).get("properties", {}).get("top_k"), "maximum", MAX_TOP_K, vocab_size)
        _bound(schemas.get("CompletionBody", {}).get("properties", {}).get("prompt"), "maximum", MAX_TOKEN_ID,
               vocab_size - 1)
        _bound(schemas.get("DetectBody", {}).get("properties", {}).get("token_ids"), "maximum", MAX_TOKEN_ID,
               vocab_size - 1)

    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            parameters = operation.get("parameters", [])
            secured = any(p.get("in") == "header" and p.get("name", "").lower() == _SECURED_HEADER
                          for p in parameters)
            operation["parameters"] = [p for p in parameters if not (
                p.get("in") == "header" and p.get("name", "").lower() == _SECURED_HEADER)]
            if not operation["parameters"]:
                del operation["parameters"]
            responses = operation.setdefault("responses", {})
            codes = {500}
            if secured:
                operation["security"] = [{"bearerAuth": []}]
                codes |= {401, 403}
            if "requestBody" in operation:
                codes |= {413, 415, 422}
            if operation.get("parameters"):
                codes.add(422)
            codes |= set(_EXTRA.get((method, path), _ADMIN if path.startswith("/v1/admin/") else ()))
            responses.pop("422", None)
            for status in sorted(codes):
                responses[str(status)] = _error_response(status)
            ok = responses.setdefault("200", {"description": "Successful Response"})
            if (method, path) in _STREAMING:
                ok["description"] = "JSON, or server-sent events (`data: {...}` lines, then `data: [DONE]`) " \
                                    "when the body asks for `\"stream\": true`."
                ok.setdefault("content", {})["text/event-stream"] = {"schema": _SSE_EVENT}
            if (method, path) == ("get", "/metrics"):
                ok["content"] = {_PROMETHEUS: {"schema": {"type": "string"}}}
                ok["description"] = "Prometheus text exposition format."
    return doc


def install(app: FastAPI, settings, state: dict) -> None:
    """Serve :func:`build`'s document at /openapi.json (and so in /docs)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            services = state.get("services")
            vocab = getattr(services.engine, "vocab_size", None) if services is not None else None
            doc = build(app, max_tokens_cap=settings.max_tokens_cap, vocab_size=vocab or None)
            if services is None:  # before start-up: do not keep a document without the model's bounds
                return doc
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
