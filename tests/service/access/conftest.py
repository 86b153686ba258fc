from __future__ import annotations

import httpx
import pytest

from keys.db import open_store
from keys.tokens import grant_scope, issue_token
from tests.service import gateway as gw


def with_expert_and_generation(gateway, more_tokens=None) -> httpx.Client:
    """Gives a running test gateway an expert token (``gateway.tokens["expert"]``; and whatever
    ``more_tokens(session)`` issues, as the owner), ``gateway.client`` and
    ``gateway.generated``: one 230-token generation of acme's. Returns the client."""
    store = open_store(gateway.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            gateway.tokens["expert"] = issue_token(session, tenant=None, expert=True, actor="test").raw_token
            if more_tokens is not None:
                more_tokens(session)
    finally:
        store.close()
    client = httpx.Client(base_url=gateway.url, timeout=120)
    response = client.post("/v1/generate", json={"prompt": "The history of the city", "max_tokens": 230, "seed": 3},
                           headers={"Authorization": f"Bearer {gateway.tokens['acme']}"})
    assert response.status_code == 200, response.text
    gateway.generated = response.json()["text"]
    gateway.client = client
    return client


@pytest.fixture(scope="module")
def tiers(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("tiers"), draft_model=None, secrets=gw.FIXED_SECRETS,
                       public_tokens_per_day=1e7, evidence_per_day=3, key_cache_seconds=0.5,
                       probe_family_per_day=10)  # the replicas' test checks the default (3)

    def evidence_token(session) -> None:
        issued = issue_token(session, tenant="acme", actor="test")
        grant_scope(session, token_id=issued.info.token_id, scope="evidence", actor="test")
        gateway.tokens["acme_evidence"] = issued.raw_token

    client = with_expert_and_generation(gateway, evidence_token)
    yield gateway
    client.close()
    gateway.stop()
