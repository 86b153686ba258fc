"""A new user's first hour with the API, continued (issue 25): degenerate detection input
is a 422 in the error shape (item 8); a record says what share of its tokens its
``unwatermarked_reason`` covers, a non-streaming generation's ``created_at`` is when it
started, and a receipt can be fetched again (item 10). A real gateway on the bundled models."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest

from tests.service import gateway as gw

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("records"), secrets=gw.FIXED_SECRETS, max_tokens_cap=512)
    yield gateway
    gateway.stop()


def client(server, who="acme") -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens[who]}"}, timeout=300)


def _error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["code"] == code, error
    return error["message"]


# ---------------------------------------------------------------- item 8: degenerate input


@pytest.mark.parametrize("body, code, message", [
    ({"text": ""}, "empty_input", "text is empty: there is nothing to score"),
    ({"text": " \n\t "}, "empty_input", "text is empty (only whitespace)"),
    ({"token_ids": []}, "empty_input", "token_ids is empty"),
    ({"token_ids": [5, 99999]}, "token_out_of_vocabulary", "token_ids[1] = 99999 is outside the model's vocabulary "
                                                           "[0, 8192)"),
    ({"token_ids": [8192]}, "token_out_of_vocabulary", "token_ids[0] = 8192"),
])
def test_degenerate_detection_input_is_422_in_the_error_shape(server, body, code, message):
    with client(server) as api:
        response = api.post("/v1/detect", json=body)
        assert message in _error(response, 422, code)
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_the_vocabularys_edges_are_still_scored(server):
    with client(server) as api:
        response = api.post("/v1/detect", json={"token_ids": [0, 8191, 17]})
        assert response.status_code == 200, response.text
        assert response.json()["total_tokens"] == 3


def test_the_documents_bounds_say_so(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    body = doc["components"]["schemas"]["DetectBody"]["properties"]
    assert body["token_ids"]["minItems"] == 1 and body["token_ids"]["items"]["maximum"] == 8191
    assert body["text"]["minLength"] == 1 and body["text"]["pattern"] == r"\S"


def test_out_of_vocabulary_prompt_ids_are_refused_too(server):
    with client(server) as api:
        response = api.post("/v1/completions", json={"prompt": [1, 99999], "max_tokens": 2})
        assert response.status_code == 422, response.text
        assert "[0, 8192)" in response.json()["error"]["message"]


# ---------------------------------------------------------------- item 10: records


def _dedup_generation(server) -> dict:
    """A watermarked output that also has tokens sampled plainly (a repeated context): the
    tiny model repeats itself within a few hundred tokens."""
    with client(server) as api:
        for seed in range(1, 9):
            out = api.post("/v1/generate", json={"prompt": "The function returns", "max_tokens": 300,
                                                 "seed": seed}).json()
            record = api.get(f"/v1/generations/{out['generation_id']}").json()
            if record["unwatermarked_reason"] == "dedup" and record["watermarked"]:
                return {"out": out, "record": record}
    raise AssertionError("no output with repeated contexts in 8 seeds")


def test_a_record_says_what_share_its_unwatermarked_reason_covers(server):
    record = _dedup_generation(server)["record"]
    assert record["watermarked"] is True and record["unwatermarked_reason"] == "dedup"
    assert 0 < record["unwatermarked_tokens"] == record["output_tokens"] - record["watermarked_tokens"]
    assert record["unwatermarked_share"] == round(record["unwatermarked_tokens"] / record["output_tokens"], 6)
    assert 0 < record["unwatermarked_share"] < 1
    with client(server) as api:
        greedy = api.post("/v1/generate", json={"prompt": "Greedy", "max_tokens": 6, "temperature": 0}).json()
        plain = api.get(f"/v1/generations/{greedy['generation_id']}").json()
    assert plain["unwatermarked_reason"] == "temperature_0"
    assert plain["unwatermarked_tokens"] == plain["output_tokens"] and plain["unwatermarked_share"] == 1.0


def test_a_non_streaming_records_created_at_is_when_it_started(server):
    with client(server) as api:
        before = datetime.now().astimezone()
        out = api.post("/v1/generate", json={"prompt": "Timing", "max_tokens": 40, "seed": 2}).json()
        after = datetime.now().astimezone()
        record = api.get(f"/v1/generations/{out['generation_id']}").json()
    created, finished = datetime.fromisoformat(record["created_at"]), datetime.fromisoformat(record["updated_at"])
    assert before <= created < finished <= after, (before, created, finished, after)
    statement = out["receipt"]["statement"]
    assert datetime.fromisoformat(statement["created_at"]) == created
    assert datetime.fromisoformat(statement["finished_at"]) == finished


def test_a_receipt_can_be_fetched_again_and_verifies(server):
    from ledger.keyset import trusted_keys
    from ledger.log.note import Verifier
    from ledger.receipts import verify_receipt

    with client(server) as api:
        out = api.post("/v1/generate", json={"prompt": "Again", "max_tokens": 12, "seed": 4}).json()
        again = api.get(f"/v1/generations/{out['generation_id']}/receipt")
    assert again.status_code == 200, again.text
    receipt = again.json()
    # The same signed statement (Ed25519 is deterministic) and the same leaf, proved in the
    # same tree or, once a published checkpoint covers it, in that one.
    assert receipt["statement"] == out["receipt"]["statement"] and receipt["signature"] == out["receipt"]["signature"]
    assert receipt["log"]["leaf_index"] == out["receipt"]["log"]["leaf_index"]
    assert receipt["log"]["tree_size"] >= out["receipt"]["log"]["tree_size"]
    keyset = httpx.get(server.url + "/.well-known/hallmark-keys.json").json()
    statement = verify_receipt(receipt, trusted_keys(keyset, Verifier.parse(keyset["log"]["vkey"])), text=out["text"])
    assert statement["generation_id"] == out["generation_id"]
    # The admin view reaches it too.
    with client(server, "admin") as admin:
        assert admin.get(f"/v1/generations/{out['generation_id']}/receipt").json()["statement"] == receipt["statement"]


def test_a_streamed_generations_receipt_can_be_fetched_again(server):
    import json

    with client(server) as api:
        with api.stream("POST", "/v1/generate", json={"prompt": "Streamed", "max_tokens": 10, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        done = events[-1]
        assert done["type"] == "done"
        again = api.get(f"/v1/generations/{done['generation_id']}/receipt").json()
    assert again["statement"] == done["receipt"]["statement"]
    assert again["statement"]["created_at"] < again["statement"]["finished_at"]


def test_receipt_look_ups_are_scoped_and_unknown_ids_are_404(server):
    with client(server) as api:
        out = api.post("/v1/generate", json={"prompt": "Scoped", "max_tokens": 4}).json()
        assert "no generation" in _error(api.get("/v1/generations/" + "0" * 32 + "/receipt"), 404, "not_found")
        _error(api.get("/v1/generations/not-an-id/receipt"), 404, "not_found")
    with client(server, "globex") as other:  # another tenant's generation reads as unknown
        record = other.get(f"/v1/generations/{out['generation_id']}")
        assert record.status_code == 404
        _error(other.get(f"/v1/generations/{out['generation_id']}/receipt"), 404, "not_found")
    assert httpx.get(f"{server.url}/v1/generations/{out['generation_id']}/receipt").status_code == 401


def test_an_unfinished_generation_has_no_receipt_yet(server):
    from keys.db import open_store
    from ledger.entries import start_generation
    from keys.tenants import get_tenant

    store = open_store(server.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            tenant_id = get_tenant(session, name="acme").id
            generation_id = start_generation(session, tenant_id=tenant_id, key_id=None, key_version=None,
                                             engine="local", model="m", spec=None, prompt_tokens=1,
                                             unwatermarked_reason="opt_out").id
    finally:
        store.close()
    with client(server) as api:
        assert "has not finished" in _error(api.get(f"/v1/generations/{generation_id}/receipt"), 409,
                                            "generation_unfinished")
