"""Issue 30 item 4: the core's ``sign=False`` statement, re-signed over a tier's view, says
exactly what the sign-twice path said (the public tier uses it; the tenant tier could); a
public request tokenises each text once (the probe sketch, the public count and the core
share one :class:`service.detection.Tokenised`)."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest
from fastapi.testclient import TestClient

from ledger.receipts import public_keys
from ledger.reports import verify_report
from service import detection
from service.access import gate, shape
from service.access.tiers import PUBLIC, TENANT
from service.app import create_app
from service.auth import authenticate
from service.routes import detect as detect_route
from service.schemas import DetectBody
from service.settings import ServiceSettings
from tests.service import gateway as gw

CLIENT = "192.0.2.7"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    store_settings, tokens = gw.provision(tmp_path_factory.mktemp("sign_once"))
    settings = ServiceSettings(detect_rate_per_minute=100_000, detect_burst=100_000, probe_family_per_day=1000,
                               public_min_tokens=100)
    application = create_app(settings, store_settings=store_settings)
    with TestClient(application) as client:
        text = client.post("/v1/generate", headers={"Authorization": f"Bearer {tokens['acme']}"},
                           json={"prompt": "The history of the city", "max_tokens": 200, "seed": 3}).json()["text"]
        services = application.state.services
        keys = public_keys(client.get("/.well-known/hallmark-keys.json").json())
        yield type("App", (), {"services": services, "tokens": tokens, "text": text, "keys": keys})


def _without_time(statement: dict) -> dict:
    return {k: v for k, v in statement.items() if k != "created_at"}


@pytest.mark.parametrize("tier", [TENANT, PUBLIC])
@pytest.mark.parametrize("edited", [False, True])
def test_the_tier_signed_once_states_what_it_did_signed_twice(app, tier, edited):
    services = app.services
    text = app.text.replace(" the ", " a ", 2) if edited else app.text
    if tier == TENANT:
        identity = authenticate(services, f"Bearer {app.tokens['acme']}")
    else:
        identity = gate._public_identity(gate.principal(services, None, CLIENT))
    reports = []
    for sign in (True, False):
        full = detection.detect(services, identity, DetectBody(text=text), sign=sign, counted=False)
        assert ("signature" in full["report"]) is sign  # unsigned: one signature a request
        key_state = (full.get("key") or {}).get("state")
        if tier == TENANT:
            shown = shape.tenant_answer(full, evidence=False)
        else:
            shown = shape.public_answer(full, tokens=full["total_tokens"], min_tokens=100, provider="p",
                                        attributed=set())
        report = shape.resign(services, full["report"], shown, tier, key_state)
        assert verify_report(report, app.keys, text=text).statement["access"]["tier"] == tier
        reports.append(report)
    assert _without_time(reports[0]["statement"]) == _without_time(reports[1]["statement"])
    assert reports[0].get("log") == reports[1].get("log")


@pytest.mark.parametrize("tier", [PUBLIC])  # the tenant tier does not share yet (service.access.gate.answer)
def test_a_request_tokenises_each_text_once(app, tier, monkeypatch):
    services = app.services
    calls: Counter[str] = Counter()
    real = detection.tokenize_with_offsets

    def counted(tokenizer, text):
        calls[text] += 1
        return real(tokenizer, text)

    monkeypatch.setattr(detection, "tokenize_with_offsets", counted)
    identity = authenticate(services, f"Bearer {app.tokens['acme']}") if tier == TENANT else None
    body = DetectBody(text=app.text.replace(" the ", " this ", 1))
    response = asyncio.run(detect_route._answer(services, identity, body, CLIENT if tier == PUBLIC else None))
    assert response.status_code == 200 and response.headers["X-Hallmark-Access-Tier"] == tier
    assert calls[body.text] == 1 and max(calls.values()) == 1, calls
    assert verify_report(httpx.Response(200, content=response.body).json()["report"], app.keys, text=body.text)
