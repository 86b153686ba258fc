"""Every token kind against every detection route and option, over HTTP against a running
gateway (issue 31 item 1): the tier follows what the token may reach. A tenant's admin token
detects in the tenant tier (it had the operator tier: exact p, no guard, no budget, no audit);
only the global admin token and expert tokens get full results, and each of their requests
is an audit event."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select

from keys.db import open_store
from keys.models import AuditEvent
from keys.tokens import grant_scope, issue_token
from tests.service import gateway as gw

KINDS = ("none", "tenant", "tenant_evidence", "tenant_admin", "global_admin", "expert")
OPTIONS = {
    "text": {},
    "token_ids": {"token_ids": True},  # replaced by the generation's ids
    "evidence": {"evidence": True},
    "threshold_power_of_ten": {"threshold": 1e-3},
    "threshold_between": {"threshold": 2e-4},
    "other_tenant": {"tenant": "globex"},
}
TIER = {"tenant": "tenant", "tenant_evidence": "tenant", "tenant_admin": "tenant", "global_admin": "operator",
        "expert": "expert"}
AUDITED = {"global_admin": "detection.operator", "expert": "detection.expert"}


def _expected(kind: str, option: str) -> int:
    """The status of POST /v1/detect for a token kind and an option."""
    if kind == "none":
        return 401
    if TIER[kind] == "tenant":
        if option == "threshold_between":
            return 403  # a rounded p must not be bisected
        if option == "threshold_power_of_ten":
            return 403  # looser than the policy maximum: stepped down, it would be the ratchet's gradient
        if option == "other_tenant":
            return 403
        if option == "evidence" and kind != "tenant_evidence":
            return 403  # needs the scope; an admin token of the tenant has none
    return 200


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    # The probe guard is not what this module tests: one text through every cell.
    gateway = gw.start(tmp_path_factory.mktemp("matrix"), draft_model=None, secrets=gw.FIXED_SECRETS,
                       probe_family_per_day=1000, evidence_per_day=1000, public_tokens_per_day=1e7)
    store = open_store(gateway.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            gateway.tokens["expert"] = issue_token(session, tenant=None, expert=True, actor="test").raw_token
            gateway.tokens["tenant_admin"] = issue_token(session, tenant="acme", admin=True, actor="test").raw_token
            issued = issue_token(session, tenant="acme", actor="test")
            grant_scope(session, token_id=issued.info.token_id, scope="evidence", actor="test")
            gateway.tokens["tenant_evidence"] = issued.raw_token
    finally:
        store.close()
    gateway.tokens["tenant"] = gateway.tokens["acme"]
    gateway.tokens["global_admin"] = gateway.tokens["admin"]
    client = httpx.Client(base_url=gateway.url, timeout=120)
    made = client.post("/v1/generate", json={"prompt": "The history of the city", "max_tokens": 230, "seed": 3},
                       headers={"Authorization": f"Bearer {gateway.tokens['acme']}"})
    assert made.status_code == 200, made.text
    gateway.generated, gateway.token_ids = made.json()["text"], made.json()["token_ids"]
    gateway.client = client
    yield gateway
    client.close()
    gateway.stop()


def _audits(gateway, action: str) -> int:
    store = open_store(gateway.store_settings, require_kek=True)
    try:
        with store.transaction(write=False) as session:
            return session.scalar(select(func.count()).select_from(AuditEvent).where(AuditEvent.action == action))
    finally:
        store.close()


def _headers(gateway, kind: str) -> dict[str, str]:
    return {} if kind == "none" else {"Authorization": f"Bearer {gateway.tokens[kind]}"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_token_kind_against_every_option_of_v1_detect(matrix, kind):
    for option, extra in OPTIONS.items():
        body = {"text": matrix.generated, **extra}
        if "token_ids" in extra:
            body = {"token_ids": matrix.token_ids}
        audited_before = _audits(matrix, AUDITED[kind]) if kind in AUDITED else 0
        response = matrix.client.post("/v1/detect", json=body, headers=_headers(matrix, kind))
        assert response.status_code == _expected(kind, option), (kind, option, response.text)
        if response.status_code != 200:
            continue
        shown = response.json()
        assert response.headers["x-hallmark-access-tier"] == TIER[kind], (kind, option)
        if TIER[kind] == "tenant":
            # Rounded to a whole power of ten, no scores: what a tenant may see, admin or not.
            assert shown["tier"] == "tenant" and float(shown["log10_p_value"]).is_integer(), (kind, option)
            assert "score" not in shown and "log10_p_sum" not in shown
            assert shown["report"]["statement"]["access"] == {"tier": "tenant"}
        else:
            assert not float(shown["log10_p_value"]).is_integer(), (kind, option)  # the core's exact value
        if option == "evidence":
            assert shown.get("evidence"), (kind, option)
        if kind in AUDITED:
            assert _audits(matrix, AUDITED[kind]) == audited_before + 1, (kind, option)


@pytest.mark.parametrize("kind", KINDS)
def test_every_token_kind_on_the_public_route_is_the_public_tier(matrix, kind):
    """The public route reads no token: whatever is sent, the answer is the public tier's, and
    every option but the text is refused (422: the public body has the text only)."""
    response = matrix.client.post("/v1/public/detect", json={"text": matrix.generated}, headers=_headers(matrix, kind))
    assert response.status_code == 200, response.text
    assert response.headers["x-hallmark-access-tier"] == "public" and response.json()["tier"] == "public"
    for option, extra in OPTIONS.items():
        if option == "text":
            continue
        body = {"token_ids": matrix.token_ids} if "token_ids" in extra else {"text": matrix.generated, **extra}
        refused = matrix.client.post("/v1/public/detect", json=body, headers=_headers(matrix, kind))
        assert refused.status_code == 422, (kind, option, refused.text)


def test_a_tenant_admin_token_shares_its_tenants_budget_and_text_families(tmp_path):
    """Issue 31's first attack: the tenant's admin token had its own unlimited operator tier.
    Now its queries and a plain token's are one principal: the family's third check through
    either token ends it for both."""
    gateway = gw.start(tmp_path, draft_model=None, probe_family_per_day=3)
    try:
        store = open_store(gateway.store_settings, require_kek=True)
        try:
            with store.transaction() as session:
                admin = issue_token(session, tenant="acme", admin=True, actor="test").raw_token
        finally:
            store.close()
        text = ("A short paragraph about the harbour and the ferry and the baker on the corner, "
                "written by a person, checked again and again by someone who edits it a little each time.")
        with httpx.Client(base_url=gateway.url, timeout=120) as client:
            statuses = [client.post("/v1/detect", json={"text": text + f" edit {i}"},
                                    headers={"Authorization": f"Bearer {token}"}).status_code
                        for i, token in enumerate((admin, gateway.tokens["acme"], admin, gateway.tokens["acme"]))]
        assert statuses == [200, 200, 200, 429]
    finally:
        gateway.stop()


def test_a_tenants_per_token_evidence_is_only_of_its_own_unedited_generation(matrix):
    """Issue 31 item 3: per-token scores plan the next edit. A tenant with the `evidence` scope
    gets them for its own recorded generation as recorded; for an edited copy or another text
    the answer says why they are withheld. Experts and the operator get them everywhere."""
    edited = matrix.generated.replace(" ", "  ", 3).split()
    edited[5] = "harbour"
    edited = " ".join(edited)
    for text, shown in ((matrix.generated, True), (edited, False)):
        answer = matrix.client.post("/v1/detect", json={"text": text, "evidence": True},
                                    headers=_headers(matrix, "tenant_evidence")).json()
        assert bool(answer.get("evidence")) is shown, text[:40]
        assert ("evidence_withheld" in answer) is (not shown)
        full = matrix.client.post("/v1/detect", json={"text": text, "evidence": True},
                                  headers=_headers(matrix, "expert")).json()
        assert full["evidence"]["tokens"]
