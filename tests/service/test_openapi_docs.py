"""/docs reads as written, not generated (issue 25, item 13): every route under a described
tag, with a summary and a description, and a response model for each JSON 200 instead of
`{}`; the models hold the real gateway's responses."""

from __future__ import annotations

import httpx
import pytest

from service import responses
from tests.service.openapi_doc import build_doc, operations
from tests.service import gateway as gw


@pytest.fixture(scope="module")
def doc():
    return build_doc()


def test_every_route_has_a_described_tag_a_summary_and_a_description(doc):
    tags = {t["name"]: t["description"] for t in doc["tags"]}
    assert all(tags.values()) and "default" not in tags
    for method, path, op in operations(doc):
        assert len(op.get("tags", [])) == 1 and op["tags"][0] in tags, (method, path)
        summary = op.get("summary", "")
        # FastAPI's own summary is the function's name in title case ("Generate Route").
        assert summary and not summary.endswith((" Route", "route")) and "_" not in summary, (method, path, summary)
        assert len(op.get("description", "")) > 30, (method, path)
    used = {op["tags"][0] for _, _, op in operations(doc)}
    assert used == set(tags)  # no tag without a route


def test_every_json_200_has_a_response_model(doc):
    schemas = doc["components"]["schemas"]
    for method, path, op in operations(doc):
        content = op["responses"]["200"].get("content", {})
        if "application/json" not in content:
            assert set(content) <= {"text/plain", "text/plain; version=0.0.4"}, (method, path)
            continue
        schema = content["application/json"]["schema"]
        assert schema != {} and schema["$ref"].startswith("#/components/schemas/"), (method, path)
        assert schemas[schema["$ref"].rsplit("/", 1)[1]]["properties"], (method, path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The tenant tokens hold the evidence scope: the documented response includes per-token evidence.
    gateway = gw.start(tmp_path_factory.mktemp("docs"), max_tokens_cap=512, scopes=("evidence",))
    yield gateway
    gateway.stop()


@pytest.mark.slow
def test_the_models_hold_the_gateways_responses(server):
    acme = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens['acme']}"}, timeout=300)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens['admin']}"}, timeout=300)
    # The stack's keys are random: a short generation can stop at once or be only whitespace,
    # which /v1/detect rightly refuses (422 empty_input); the first with text to score is used.
    for attempt in range(10):
        out = acme.post("/v1/generate", json={"prompt": f"Docs {attempt}", "max_tokens": 16}).json()
        if out["text"].strip():
            break
    assert out["text"].strip(), out
    gid = out["generation_id"]
    checks = [
        (responses.GenerateResponse, out),
        (responses.CompletionResponse, acme.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4}).json()),
        (responses.CompletionResponse, acme.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).json()),
        (responses.ModelList, acme.get("/v1/models").json()),
        (responses.DetectResponse, acme.post("/v1/detect", json={"text": out["text"], "evidence": True}).json()),
        (responses.DetectResponse, acme.post("/v1/detect", json={"token_ids": out["token_ids"]}).json()),
        (responses.GenerationRecord, acme.get(f"/v1/generations/{gid}").json()),
        (responses.SignedDocument, acme.get(f"/v1/generations/{gid}/receipt").json()),
        (responses.GenerationPage, acme.get("/v1/generations").json()),
        (responses.KeySet, httpx.get(server.url + "/.well-known/hallmark-keys.json").json()),
        (responses.Me, acme.get("/v1/me").json()),
        (responses.TenantList, admin.get("/v1/admin/tenants").json()),
        (responses.KeyList, admin.get("/v1/admin/keys").json()),
        (responses.AuditLog, admin.get("/v1/admin/audit").json()),
        (responses.DetectResponse, admin.post("/v1/detect", json={"text": out["text"], "evidence": True}).json()),
        (responses.PublicDetectResponse, httpx.post(server.url + "/v1/public/detect", json={"text": out["text"]},
                                                    timeout=300).json()),
        (responses.Health, httpx.get(server.url + "/healthz").json()),
        (responses.Ready, httpx.get(server.url + "/readyz").json()),
    ]
    for model, body in checks:
        model.model_validate(body, strict=True)
        # Every field the model names is in the response (nothing documented that never comes).
        required = {f.alias or name for name, f in model.model_fields.items() if f.is_required()}
        assert required <= set(body), (model.__name__, required - set(body))


def test_the_reference_opens_with_what_hallmark_is_and_how_to_authenticate(doc):
    """Issue 34, item 10: /docs had no top-level description: a reader met a list of routes
    without being told what the service is or how to present a token."""
    description = doc["info"]["description"]
    for words in ("watermark", "Authorization: Bearer", "make run", "hallmark tokens issue", "/v1/public/detect",
                  "X-Hallmark-Access-Tier", "Retry-After", "/ui"):
        assert words in description, words
