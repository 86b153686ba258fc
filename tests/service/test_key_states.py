"""After a key is rotated or revoked, records and ledger matches say both states, each named:
``key_state_at_generation`` (what the ledger recorded; ``key_state`` keeps that meaning)
and ``key_state_now``. Before, a record under a key revoked since still read "active"."""

from __future__ import annotations

import httpx
import pytest

from keys.db import open_store
from keys.lifecycle import revoke_key, rotate_key
from service.app import create_app
from service.settings import ServiceSettings
from tests.service import gateway as gw
from tests.service.test_stream_provenance import ScriptedEngine


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store_settings, tokens = gw.provision(tmp_path_factory.mktemp("states"))
    app = create_app(ServiceSettings(max_tokens_cap=1024, detect_rate_per_minute=100_000, detect_burst=100_000),
                     engine=ScriptedEngine(), store_settings=store_settings)
    url, uv, thread = gw.serve(app)
    store = open_store(store_settings, require_kek=True)
    yield type("S", (), {"url": url, "tokens": tokens, "store": store})
    store.close()
    uv.should_exit = True
    thread.join(30)


def _client(server, who="acme"):
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens[who]}"}, timeout=60)


def _states(item):
    return item["key_state"], item["key_state_at_generation"], item["key_state_now"]


def test_records_and_ledger_matches_show_the_key_state_now_and_at_generation(server):
    acme = _client(server)
    out = acme.post("/v1/generate", json={"prompt": "hi", "max_tokens": 64}).json()
    generation_id, key_id = out["generation_id"], out["watermark"]["key_id"]
    record = acme.get(f"/v1/generations/{generation_id}").json()
    assert _states(record) == ("active", "active", "active")

    with server.store.transaction() as session:
        rotate_key(session, server.store.keyring, tenant="acme", actor="test")
    record = acme.get(f"/v1/generations/{generation_id}").json()
    assert _states(record) == ("active", "active", "verify-only")

    with server.store.transaction() as session:
        revoke_key(session, key_id=key_id, reason="leaked in the test", actor="test")
    record = acme.get(f"/v1/generations/{generation_id}").json()
    assert _states(record) == ("active", "active", "revoked")
    listed = acme.get("/v1/generations", params={"key_id": key_id}).json()["generations"]
    assert [_states(g) for g in listed if g["id"] == generation_id] == [("active", "active", "revoked")]
    admin = _client(server, "admin").get(f"/v1/generations/{generation_id}").json()
    assert _states(admin) == ("active", "active", "revoked")

    # The exact copy (its output hash) and an edited copy (shared k-grams) name both states.
    exact = acme.post("/v1/detect", json={"token_ids": out["token_ids"]}).json()
    [match] = [m for m in exact["ledger_matches"] if m["generation_id"] == generation_id]
    assert _states(match) == ("active", "active", "revoked")
    edited = out["token_ids"][:20] + [499, 498] + out["token_ids"][22:]
    found = acme.post("/v1/detect", json={"token_ids": edited}).json()
    [kgram] = [m for m in found["kgram_matches"] if m["generation_id"] == generation_id]
    assert (kgram["key_state_at_generation"], kgram["key_state_now"]) == ("active", "revoked")

    # A generation without a key (opted out) has neither.
    plain = _client(server, "admin").post("/v1/generate", json={"prompt": "hi", "max_tokens": 4, "watermark": False,
                                                                 "tenant": "acme"}).json()
    record = _client(server, "globex").get(f"/v1/generations/{plain['generation_id']}")
    assert record.status_code == 404  # another tenant's
    record = acme.get(f"/v1/generations/{plain['generation_id']}").json()
    assert (record["key_state_at_generation"], record["key_state_now"]) == (None, None)
