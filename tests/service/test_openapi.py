"""The OpenAPI document tells the truth, and schemathesis agrees: every operation, every
check, zero failures (a short run here; ``python -m bench.schemathesis_run`` runs longer)."""

from __future__ import annotations

import re

import pytest

from bench.schemathesis_run import run
from tests.service.openapi_doc import build_doc, operations


@pytest.fixture(scope="module")
def doc():
    return build_doc()


def test_bearer_scheme_instead_of_a_header_parameter(doc):
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        **doc["components"]["securitySchemes"]["bearerAuth"], "type": "http", "scheme": "bearer"}
    secured = {(m, p) for m, p, op in operations(doc) if op.get("security") == [{"bearerAuth": []}]}
    assert {("post", "/v1/generate"), ("post", "/v1/detect"), ("get", "/v1/generations/{generation_id}"),
            ("post", "/v1/chat/completions")} <= secured
    assert ("get", "/healthz") not in secured
    for _, _, op in operations(doc):
        assert all(p["name"].lower() != "authorization" for p in op.get("parameters", []))


def test_every_error_has_the_error_schema(doc):
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for method, path, op in operations(doc):
        assert "500" in op["responses"], (method, path)
        for status, response in op["responses"].items():
            if int(status) >= 400:
                assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    generate = doc["paths"]["/v1/generate"]["post"]["responses"]
    assert {"401", "403", "409", "413", "415", "422", "429", "503"} <= set(generate)
    for path in ("/v1/completions", "/v1/chat/completions"):  # unsupported parameter; unknown model
        assert {"400", "404"} <= set(doc["paths"][path]["post"]["responses"])
    assert "tools" in doc["components"]["schemas"]["ChatBody"]["properties"]


def test_content_types_and_deployment_bounds(doc):
    for path in ("/v1/generate", "/v1/completions", "/v1/chat/completions"):
        assert "text/event-stream" in doc["paths"][path]["post"]["responses"]["200"]["content"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain; version=0.0.4"]
    body = doc["components"]["schemas"]["GenerateBody"]["properties"]
    assert body["max_tokens"]["anyOf"][0]["maximum"] == 64 and body["top_k"]["maximum"] == 8192
    assert doc["components"]["schemas"]["GenerateBody"]["additionalProperties"] is False


def test_detect_options_are_documented_with_the_status_their_misuse_gets(doc):
    # The request's options carry their meaning in /docs: the enum alone does not say that
    # `routed` needs keyed-coin keys (409 statistic_unavailable, not 422), nor what `auto` does.
    body = doc["components"]["schemas"]["DetectBody"]["properties"]
    for name in ("tenant", "threshold", "statistic", "test", "spans", "normalize", "evidence"):
        assert body[name].get("description"), name
    assert "409" in body["statistic"]["description"] and "422" not in body["statistic"]["description"]
    assert "auto" in body["statistic"]["description"] and "auto" in body["test"]["description"]


@pytest.mark.slow
def test_schemathesis_every_check_zero_failures():
    code, output, _ = run(12, seed=7)
    selected = re.search(r"Selected: (\d+)/(\d+)", output)
    tested = re.search(r"Tested: (\d+)", output)
    assert code == 0, output[-6000:]
    # Every operation of the document was exercised.
    assert selected and tested and selected.group(1) == selected.group(2) == tested.group(1), output[-3000:]
