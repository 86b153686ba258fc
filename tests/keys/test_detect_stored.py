"""`hallmark detect --tenant`: every key of the tenant, with the winning key's identity and
state, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

from tests.synthetic import generate, human_like
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def _material(cli, key_id: str, salt: int | None = None) -> WatermarkKey:
    """The key as a generation runs under it: a salted `diverse` key with its salt."""
    exported = cli.ok("keys", "export", key_id, "--yes", "--json").json()
    key = WatermarkKey(int(exported["secret"]), WatermarkSpec.model_validate(exported["spec"]))
    return key.with_salt(salt) if key.spec.salted else key


def test_detect_against_a_tenants_history(cli):
    cli.ok("tenants", "create", "acme")
    # --dedup single_turn: a diverse key of the salt scheme (a rotation keeps it).
    first = cli.ok("keys", "create", "--tenant", "acme", "--dedup", "single_turn", "--json").json()["key_id"]
    cli.ok("keys", "rotate", "--tenant", "acme")
    keys = {k["key_id"]: k for k in cli.ok("keys", "list", "--tenant", "acme", "--json").json()}
    second = next(k for k in keys if k != first)
    cli.ok("keys", "revoke", first, "--reason", "leaked")
    old, new = _material(cli, first, salt=3), _material(cli, second, salt=12)

    for key, key_id, state in ((old, first, "revoked"), (new, second, "active")):
        tokens, _ = generate(key, 120, seed=key.secret % 1000)
        result = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(tokens), "--json").json()
        assert result["watermarked"] and result["keys_tested"] == 2 and result["tests"] == 2 * 16  # two diverse keys, 16 salts each
        assert result["key"]["key_id"] == key_id and result["key"]["state"] == state
        assert result["key"]["salt"] == key.salt
        assert result["key"]["tenant"] == "acme" and result["key"]["version"] == keys[key_id]["version"]
        assert str(key.secret) not in json.dumps(result)

    human = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(human_like(300, seed=4)), "--json").json()
    assert not human["watermarked"] and human["key"] is None


def test_detect_unknown_tenant_is_one_line(cli):
    result = cli.fails("detect", "--tenant", "nobody", "--token-ids", "[1, 2, 3]")
    assert "nobody" in result.stderr


def _record(store, cli, tenant: str, key_id: str, key: WatermarkKey, tokens: list[int], text: str) -> str:
    from ledger import kgrams
    from ledger.entries import record_generation

    tenant_id = next(t["id"] for t in cli.ok("tenants", "list", "--json").json() if t["name"] == tenant)
    with store.transaction() as session:
        entry = record_generation(session, tenant_id=tenant_id, key_id=key_id, key_version=1, engine="local",
                                  model="m", spec=key.spec, prompt_tokens=1, watermarked_tokens=len(tokens),
                                  unwatermarked_reason=None, output_text=text, token_ids=tokens,
                                  kgram_set=kgrams.kgram_set(key_id, key.secret, tokens),
                                  details=None if key.salt is None else {"salt": key.salt})
    return entry.id


def test_detect_reports_the_ledgers_evidence_as_the_api_does(cli, store):
    """docs/reference/result-schema.md: `hallmark detect --json` has the API's result schema, ledger evidence included:
    the exact copy's record (ledger_matches) and, for an edited copy, the generations sharing
    its 8-token runs (kgram_matches), with "ledger" in basis. Before, the CLI left both out."""
    from service.tokenization import load_tokenizer

    cli.ok("tenants", "create", "acme")
    key_id = cli.ok("keys", "create", "--tenant", "acme", "--json").json()["key_id"]
    cli.ok("tenants", "create", "beta")
    cli.ok("keys", "create", "--tenant", "beta")
    key = _material(cli, key_id, salt=9)
    text = ("Return the number of items in the container, counting each distinct element once and "
            "ignoring the order in which they were added to it.")
    exact_id = _record(store, cli, "acme", key_id, key, load_tokenizer("bundled").encode(text, add_special_tokens=False),
                       text)
    exact = cli.ok("detect", "--tenant", "acme", "--text", text, "--tokenizer", "bundled", "--json").json()
    assert [m["generation_id"] for m in exact["ledger_matches"]] == [exact_id]
    assert exact["basis"] == ["ledger"] and not exact["watermarked"]
    assert "exact copy of generation " + exact_id in cli.ok("detect", "--tenant", "acme", "--text", text,
                                                             "--tokenizer", "bundled").stdout

    tokens, _ = generate(key, 200, seed=11)
    generated_id = _record(store, cli, "acme", key_id, key, tokens, "generated")
    edited = list(tokens)
    for i in range(0, len(edited), 10):
        edited[i] = (edited[i] + 1) % 2000
    result = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(edited), "--json").json()
    assert result["ledger_matches"] == [] and "ledger" in result["basis"]
    match = result["kgram_matches"][0]
    assert match["generation_id"] == generated_id and match["passes"] and match["log10_false_match_bound"] < -6
    assert str(key.secret) not in json.dumps(result)
    assert "eight-token sequences with generation " + generated_id in cli.ok(
        "detect", "--tenant", "acme", "--token-ids", json.dumps(edited)).stdout

    # Scoped like the API: another tenant's keys and ledger see nothing.
    other = cli.ok("detect", "--tenant", "beta", "--token-ids", json.dumps(edited), "--json").json()
    assert other["ledger_matches"] == [] and other["kgram_matches"] == [] and other["basis"] == []
    everyone = cli.ok("detect", "--all-tenants", "--token-ids", json.dumps(edited), "--json").json()
    assert [m["generation_id"] for m in everyone["kgram_matches"]] == [generated_id]


def test_shared_phrases_without_the_watermark_are_not_a_ledger_basis(cli, store):
    """A text that shares phrases with a generation is an edited copy of it only when the shared
    tokens carry the generation's watermark. Tokens the generation reproduced with no choice
    to make (boilerplate; here: tokens not drawn under the key at all) score as on any text,
    and people write the same phrases: 40 of 102 chunks of the standard library's own
    documentation were reported as edited copies of one of 20 bundled-model generations. The
    match is still listed (collision bound and all), with passes false and no ledger basis."""
    cli.ok("tenants", "create", "acme")
    key_id = cli.ok("keys", "create", "--tenant", "acme", "--json").json()["key_id"]
    key = _material(cli, key_id)
    boilerplate = human_like(120, seed=9)
    generation_id = _record(store, cli, "acme", key_id, key, boilerplate, "boilerplate")
    # A person's text that contains 40 tokens of the same boilerplate.
    text = human_like(80, seed=1) + boilerplate[30:70] + human_like(80, seed=2)
    result = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(text), "--json").json()
    match = next(m for m in result["kgram_matches"] if m["generation_id"] == generation_id)
    assert match["matched_kgrams"] >= 20 and match["log10_false_match_bound"] < -100
    assert match["shared_tokens"] >= 20 and match["log10_shared_p"] > -3 and not match["passes"]
    assert result["basis"] == [] and not result["watermarked"]
    assert "ledger" not in cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(text)).stdout


def test_a_new_diverse_key_is_one_test(cli):
    # A new key's default `diverse` scheme is the unwatermarked head (watermark.head): never
    # salted, so detection tests it once, with no salt and no correction for salts.
    cli.ok("tenants", "create", "acme")
    key_id = cli.ok("keys", "create", "--tenant", "acme", "--json").json()["key_id"]
    key = _material(cli, key_id)
    assert key.spec.mode == "diverse" and key.spec.diversity == "head" and key.salt is None
    tokens, _ = generate(key, 120, seed=7)
    result = cli.ok("detect", "--tenant", "acme", "--token-ids", json.dumps(tokens), "--json").json()
    assert result["watermarked"] and result["keys_tested"] == 1
    assert result["key"]["key_id"] == key_id and "salt" not in result["key"]
