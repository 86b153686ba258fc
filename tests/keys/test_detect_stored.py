"""`hallmark detect --tenant`: every key of the tenant, with the winning key's identity and
state, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

from tests.synthetic import generate, human_like
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def _material(cli, key_id: str) -> WatermarkKey:
    exported = cli.ok("keys", "export", key_id, "--yes", "--json").json()
    return WatermarkKey(int(exported["secret"]), WatermarkSpec.model_validate(exported["spec"]))


def test_detect_against_a_tenants_history(cli):
    cli.ok("tenants", "create", "acme")
    first = cli.ok("keys", "create", "--tenant", "acme", "--json").json()["key_id"]
    cli.ok("keys", "rotate", "--tenant", "acme")
    keys = {k["key_id"]: k for k in cli.ok("keys", "list", "--tenant", "acme", "--json").json()}
    second = next(k for k in keys if k != first)
    cli.ok("keys", "revoke", first, "--reason", "leaked")
    old, new = _material(cli, first), _material(cli, second)

    for key, key_id, state in ((old, first, "revoked"), (new, second, "active")):
        tokens, _ = generate(key, 120, seed=key.secret % 1000)
        result = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(tokens), "--json").json()
        assert result["watermarked"] and result["keys_tested"] == 2
        assert result["key"]["key_id"] == key_id and result["key"]["state"] == state
        assert result["key"]["tenant"] == "acme" and result["key"]["version"] == keys[key_id]["version"]
        assert str(key.secret) not in json.dumps(result)

    human = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(human_like(300, seed=4)), "--json").json()
    assert not human["watermarked"] and human["key"] is None


def test_detect_unknown_tenant_is_one_line(cli):
    result = cli.fails("detect", "--tenant", "nobody", "--token-ids", "[1, 2, 3]")
    assert "nobody" in result.stderr


def test_detect_reports_the_ledgers_evidence_as_the_api_does(cli, store):
    """README: `hallmark detect --json` has the API's result schema, ledger evidence included:
    the exact copy's record (ledger_matches) and, for an edited copy, the generations sharing
    its 8-token runs (kgram_matches), with "ledger" in basis. Before, the CLI left both out."""
    from keys import kgrams
    from keys.ledger import record_generation
    from service.tokenization import load_tokenizer

    cli.ok("tenants", "create", "acme")
    key_id = cli.ok("keys", "create", "--tenant", "acme", "--json").json()["key_id"]
    cli.ok("tenants", "create", "beta")
    cli.ok("keys", "create", "--tenant", "beta")
    key = _material(cli, key_id)
    text = ("Return the number of items in the container, counting each distinct element once and "
            "ignoring the order in which they were added to it.")
    tokens = load_tokenizer("bundled").encode(text, add_special_tokens=False)
    with store.transaction() as session:
        tenant_id = cli.ok("tenants", "list", "--json").json()[0]["id"]
        entry = record_generation(session, tenant_id=tenant_id, key_id=key_id, key_version=1, engine="local",
                                  model="m", spec=key.spec, prompt_tokens=1, watermarked_tokens=len(tokens),
                                  unwatermarked_reason=None, output_text=text, token_ids=tokens)
        kgrams.record(session, tenant_id=tenant_id, generation_id=entry.id, key_id=key_id, secret=key.secret,
                      token_ids=tokens)

    exact = cli.ok("detect", "--tenant", "acme", "--text", text, "--tokenizer", "bundled", "--json").json()
    assert [m["generation_id"] for m in exact["ledger_matches"]] == [entry.id]
    assert exact["basis"] == ["ledger"] and not exact["watermarked"]
    assert "exact copy of generation " + entry.id in cli.ok("detect", "--tenant", "acme", "--text", text,
                                                             "--tokenizer", "bundled").stdout

    edited = tokens[:12] + [7, 7, 7] + tokens[15:]
    result = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(edited), "--json").json()
    assert result["ledger_matches"] == [] and result["basis"] == ["ledger"]
    match = result["kgram_matches"][0]
    assert match["generation_id"] == entry.id and match["log10_false_match_bound"] < -6
    assert str(key.secret) not in json.dumps(result)

    # Scoped like the API: another tenant's keys and ledger see nothing.
    other = cli.ok("detect", "--tenant", "beta", "--text", text, "--tokenizer", "bundled", "--json").json()
    assert other["ledger_matches"] == [] and other["kgram_matches"] == [] and other["basis"] == []
    everyone = cli.ok("detect", "--all-tenants", "--token-ids", json.dumps(edited), "--json").json()
    assert [m["generation_id"] for m in everyone["kgram_matches"]] == [entry.id]
