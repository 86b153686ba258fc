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
