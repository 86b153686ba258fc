"""Every admin command through the real CLI entry point (service.cli.main), on SQLite and
PostgreSQL; bad input gives one line, a non-zero exit and no change."""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from keys import migrate
import yaml
from sqlalchemy import create_engine, inspect

from keys import migrate
from keys.kek import Kek, generate_kek_file
from tests.keys.conftest import Cli, count_rows, snapshot

REPO = Path(__file__).resolve().parents[2]
SECRET = 0xD1CE_5EED_0BAD_F00D


def _tenant_with_key(cli: Cli, name: str = "acme") -> dict:
    cli.ok("tenants", "create", name)
    return cli.ok("keys", "create", "--tenant", name, "--json").json()


# --- the happy paths -------------------------------------------------------------------


def test_tenants_commands(cli):
    created = cli.ok("tenants", "create", "acme", "--json").json()
    assert created["name"] == "acme" and created["id"].startswith("ten_")
    assert "created tenant beta" in cli.ok("tenants", "create", "beta").stdout
    assert [t["name"] for t in cli.ok("tenants", "list", "--json").json()] == ["acme", "beta"]
    listing = cli.ok("tenants", "list").stdout
    assert "acme" in listing and "beta" in listing


def test_tenant_names_are_one_name_in_any_case(cli):
    assert "created tenant Acme" in cli.ok("tenants", "create", "Acme").stdout  # shown as typed
    refused = cli.fails("tenants", "create", "acme")
    assert "tenant 'Acme' already exists" in refused.stderr
    assert [t["name"] for t in cli.ok("tenants", "list", "--json").json()] == ["Acme"]
    # Any spelling finds it; records show the name as created.
    assert cli.ok("keys", "create", "--tenant", "ACME", "--json").json()["tenant"] == "Acme"


def test_keys_lifecycle_commands(cli, tmp_path):
    first = _tenant_with_key(cli)
    assert (first["state"], first["version"], first["spec"]["algorithm"]) == ("active", 1, "gumbel")
    second = cli.ok("keys", "create", "--tenant", "acme", "--algorithm", "dual_key_gumbel", "--context-width", "2",
                    "--alpha", "0.3", "--dedup", "none", "--dedup-max-history", "all", "--json").json()
    assert second["state"] == "verify-only"
    assert second["spec"] | {} == {**second["spec"], "algorithm": "dual_key_gumbel", "context_width": 2,
                                   "alpha": 0.3, "dedup": "none", "dedup_max_history": None}

    rotation = cli.ok("keys", "rotate", "--tenant", "acme", "--context-width", "8", "--json").json()
    assert rotation["previous"]["key_id"] == first["key_id"] and rotation["previous"]["state"] == "verify-only"
    assert rotation["new"]["state"] == "active" and rotation["new"]["spec"]["context_width"] == 8
    assert "is active" in cli.ok("keys", "rotate", "--tenant", "acme").stdout

    listed = cli.ok("keys", "list", "--tenant", "acme", "--json").json()
    assert [(k["version"], k["state"]) for k in listed] == [(1, "verify-only"), (2, "verify-only"),
                                                             (3, "verify-only"), (4, "active")]
    assert first["key_id"] in cli.ok("keys", "list").stdout
    shown = cli.ok("keys", "show", first["key_id"], "--json").json()
    assert shown["fingerprint"] == first["fingerprint"] and "secret" not in shown
    assert f"fingerprint: {first['fingerprint']}" in cli.ok("keys", "show", first["key_id"]).stdout

    revoked = cli.ok("keys", "revoke", first["key_id"], "--reason", "found in a public repo", "--json").json()
    assert revoked["state"] == "revoked" and revoked["revocation_reason"] == "found in a public repo"

    exported = cli.ok("keys", "export", first["key_id"], "--yes", "--json").json()
    assert exported["fingerprint"] == first["fingerprint"] and exported["state"] == "revoked"
    assert exported["secret_hex"] == f"0x{exported['secret']:064x}" and exported["key_bits"] == 256
    # A tenant's first key is diverse by an unwatermarked head (issue 30) on the 256-bit PRF
    # (issue 36), which vLLM lacks: no config.
    assert exported["spec"]["mode"] == "diverse" and exported["spec"]["diversity"] == "head"
    assert exported["vllm_watermark_config"] is None
    text = cli.ok("keys", "export", first["key_id"], "--yes").stdout
    assert f"secret: {exported['secret']}" in text and "not expressible" in text
    # On vLLM's Philox a head-diverse key has no salt, so vLLM's config says the same (dedup
    # scope all samples the padded contexts without the watermark).
    head = cli.ok("keys", "create", "--tenant", "acme", "--prf", "philox", "--json").json()
    assert head["spec"]["diversity"] == "head"
    config = cli.ok("keys", "export", head["key_id"], "--yes", "--json").json()["vllm_watermark_config"]
    assert config["deduplicate_contexts"] == "all"
    salted = cli.ok("keys", "create", "--tenant", "acme", "--mode", "diverse", "--dedup", "single_turn",
                    "--prf", "philox", "--json").json()
    assert salted["spec"]["mode"] == "diverse" and "diversity" not in salted["spec"]  # the salt scheme
    assert "not expressible" in cli.ok("keys", "export", salted["key_id"], "--yes").stdout
    # A deterministic key (--mode) on a PRF vLLM has (--prf philox) exports vLLM's config with the key.
    det = cli.ok("keys", "create", "--tenant", "acme", "--mode", "deterministic", "--prf", "philox",
                 "--json").json()
    assert "mode" not in det["spec"]  # a spec without mode is deterministic (specs before issue 24)
    assert det["spec"]["prf"] == "philox4x32-10-v1" and det["key_bits"] == 64
    exported = cli.ok("keys", "export", det["key_id"], "--yes", "--json").json()
    assert exported["vllm_watermark_config"]["key"] == exported["secret"]
    assert exported["vllm_watermark_config"]["prf"] == "philox" and exported["secret"] < 2**64

    actions = [e["action"] for e in cli.ok("audit", "list", "--tenant", "acme", "--json").json()]
    assert actions == ["tenant.created", "key.created", "key.created", "key.verify_only", "key.rotated",
                       "key.verify_only", "key.rotated", "key.revoked", "key.exported", "key.exported",
                       "key.created", "key.exported", "key.created", "key.exported", "key.created", "key.exported"]
    assert len(cli.ok("audit", "list", "--action", "key.exported", "--json").json()) == 5
    assert len(cli.ok("audit", "list", "--key", first["key_id"], "--json").json()) == 5
    assert len(cli.ok("audit", "list", "--limit", "3", "--json").json()) == 3
    assert "key.revoked" in cli.ok("audit", "list").stdout


def test_keys_import_commands(cli, tmp_path):
    cli.ok("tenants", "create", "acme")
    secret_file = tmp_path / "secret"
    secret_file.write_text(f"{SECRET}\n")
    imported = cli.ok("keys", "import", "--tenant", "acme", "--secret-file", str(secret_file),
                      "--algorithm", "gumbel", "--context-width", "4", "--source", "vllm-prod-eu", "--json").json()
    assert imported["imported"] and imported["import_source"] == "vllm-prod-eu" and imported["state"] == "active"

    config = tmp_path / "wm.json"
    config.write_text(json.dumps({"key": SECRET + 1, "algorithm": "dual_key_gumbel", "context_width": 3,
                                  "alpha": 0.15, "prf": "philox"}))
    from_json = cli.ok("keys", "import", "--tenant", "acme", "--vllm-config", str(config), "--json").json()
    assert from_json["state"] == "verify-only" and from_json["spec"]["alpha"] == 0.15
    assert from_json["import_source"] == "vllm-config:wm.json"

    nested = tmp_path / "vllm.yaml"
    nested.write_text(yaml.safe_dump({"model": "m", "watermark_config": {"key": hex(SECRET + 2), "context_width": 6}}))
    from_yaml = cli.ok("keys", "import", "--tenant", "acme", "--vllm-config", str(nested), "--json").json()
    assert from_yaml["spec"]["context_width"] == 6

    exported = cli.ok("keys", "export", imported["key_id"], "--yes", "--json").json()
    assert exported["secret"] == SECRET
    assert [e["details"]["source"] for e in cli.ok("audit", "list", "--action", "key.imported", "--json").json()] \
        == ["vllm-prod-eu", "vllm-config:wm.json", "vllm-config:vllm.yaml"]


def test_tokens_commands(cli, store):
    cli.ok("tenants", "create", "acme")
    issued = cli.ok("tokens", "issue", "--tenant", "acme", "--json").json()
    assert issued["token"].startswith("hm_") and issued["tenant"] == "acme" and not issued["admin"]
    admin = cli.ok("tokens", "issue", "--admin", "--json").json()
    assert admin["admin"] and admin["tenant"] is None
    text = cli.ok("tokens", "issue", "--tenant", "acme", "--admin").stdout
    assert text.splitlines()[0].startswith("hm_") and "shown once" in text

    from keys.tokens import authenticate_token

    with store.transaction(write=False) as session:
        assert authenticate_token(session, raw_token=issued["token"]).tenant == "acme"
        assert authenticate_token(session, raw_token=admin["token"]).admin

    listed = cli.ok("tokens", "list", "--json").json()
    assert len(listed) == 3 and all("token" not in t for t in listed)
    assert len(cli.ok("tokens", "list", "--tenant", "acme", "--json").json()) == 2
    assert issued["token"] not in cli.ok("tokens", "list").stdout
    cli.ok("tokens", "revoke", issued["token_id"], "--json")
    with store.transaction(write=False) as session:
        assert authenticate_token(session, raw_token=issued["token"]) is None
    assert [e["action"] for e in cli.ok("audit", "list", "--json").json()][-4:] == \
        ["token.issued", "token.issued", "token.issued", "token.revoked"]


def test_detection_access_commands(cli, store):
    """Expert tokens, the evidence scope and a tenant's opt-in to the public check (service/access)."""
    cli.ok("tenants", "create", "acme")
    expert = cli.ok("tokens", "issue", "--expert", "--json").json()
    assert expert["kind"] == "expert" and expert["tenant"] is None and not expert["admin"]
    scoped = cli.ok("tokens", "issue", "--tenant", "acme", "--scope", "evidence", "--json").json()
    assert scoped["scopes"] == ["evidence"]
    plain = cli.ok("tokens", "issue", "--tenant", "acme", "--json").json()
    assert cli.ok("tokens", "grant", plain["token_id"], "evidence", "--json").json()["scopes"] == ["evidence"]
    assert cli.ok("tokens", "grant", plain["token_id"], "evidence", "--withdraw", "--json").json()["scopes"] == []
    assert "names it" in cli.ok("tenants", "attribution", "acme", "on").stdout
    rows = {line.split()[0]: line.split() for line in cli.ok("tokens", "list").stdout.splitlines()[1:]}
    assert rows[expert["token_id"]][4] == "expert" and rows[scoped["token_id"]][4:6] == ["standard", "evidence"]
    from keys.tokens import authenticate_token

    with store.transaction(write=False) as session:
        found = authenticate_token(session, raw_token=expert["token"])
        assert found.kind == "expert" and found.tenant_id is None
    actions = [e["action"] for e in cli.ok("audit", "list", "--json").json()]
    assert {"token.scope_granted", "token.scope_withdrawn", "tenant.public_attribution"} <= set(actions)
    # Bad input: one line, non-zero exit, nothing changed.
    before = len(cli.ok("tokens", "list", "--json").json())
    for args, says in ((("tokens", "issue", "--expert", "--tenant", "acme"), "expert token"),
                       (("tokens", "issue", "--tenant", "acme", "--scope", "admin"), "unknown scope"),
                       (("tokens", "grant", expert["token_id"], "evidence"), "already sees"),
                       (("tenants", "attribution", "acme", "maybe"), "'on' or 'off'")):
        failed = cli.fails(*args)
        assert says in failed.stderr and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert len(cli.ok("tokens", "list", "--json").json()) == before


def test_kek_commands(cli, tmp_path, kek):
    first = _tenant_with_key(cli)
    new_file = tmp_path / "new.kek"
    generated = cli.ok("kek", "generate", "--out", str(new_file), "--json").json()
    assert (new_file.stat().st_mode & 0o777) == 0o600
    result = cli.ok("kek", "rotate", "--new-kek-file", str(new_file), "--json").json()
    assert result == {"previous_kek_ids": [kek.id], "new_kek_id": generated["kek_id"], "rewrapped_keys": 1}

    old = cli.fails("keys", "export", first["key_id"], "--yes")
    assert "KEK" in old.stderr
    cli.env(HALLMARK_KEK=None, HALLMARK_KEK_FILE=str(new_file))
    assert cli.ok("keys", "export", first["key_id"], "--yes", "--json").json()["fingerprint"] == first["fingerprint"]
    (event,) = cli.ok("audit", "list", "--action", "kek.rotated", "--json").json()
    assert event["details"]["new_kek_id"] == generated["kek_id"] and event["actor"] == "test:cli"
    assert "re-wrapped 0 key(s)" not in cli.ok("kek", "rotate", "--new-kek-file",
                                                str(_new_kek_file(tmp_path, "third.kek"))).stdout


def _new_kek_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    generate_kek_file(path)
    return path


def test_db_commands(monkeypatch, capsys, empty_database_url, kek):
    cli = Cli(monkeypatch, capsys)
    cli.env(HALLMARK_DATABASE_URL=empty_database_url, HALLMARK_KEK=kek.to_base64())
    assert cli.ok("db", "current", "--json").json()["current"] is None
    head = migrate.head_revision()
    upgraded = cli.ok("db", "upgrade", "--json").json()
    assert (upgraded["from"], upgraded["to"]) == (None, head)
    assert f"already at {head}" in cli.ok("db", "upgrade").stdout
    assert cli.ok("db", "current", "--json").json() | {} == {**cli.ok("db", "current", "--json").json(),
                                                            "current": head, "head": head}
    cli.ok("tenants", "create", "acme")

    refused = cli.fails("db", "downgrade", "--revision", "base")
    assert "--yes" in refused.stderr
    assert count_rows(empty_database_url, "tenants") == 1
    down = cli.ok("db", "downgrade", "--revision", "base", "--yes", "--json").json()
    assert (down["from"], down["to"]) == (head, None)
    assert "hallmark db upgrade" in cli.fails("tenants", "list").stderr
    assert "cannot upgrade" in cli.fails("db", "upgrade", "--revision", "nope").stderr
    cli.ok("db", "upgrade")
    assert cli.ok("tenants", "list", "--json").json() == []


def test_the_console_script_entry_point(tmp_path, kek):
    """One real subprocess through `python -m service.cli`, as an operator runs it."""
    env = {**os.environ, "HALLMARK_DATABASE_URL": f"sqlite:///{tmp_path / 'h.db'}",
           "HALLMARK_KEK": kek.to_base64()}
    env.pop("HALLMARK_KEK_FILE", None)
    run = subprocess.run([sys.executable, "-m", "service.cli", "tenants", "list"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert run.stderr.startswith("error: ") and "hallmark db upgrade" in run.stderr


# --- bad input: one line, non-zero exit, nothing changed -------------------------------


def test_bad_input_is_one_line_and_changes_nothing(cli, database_url, tmp_path):
    key = _tenant_with_key(cli)
    cli.ok("tenants", "create", "keyless")
    revoked = cli.ok("keys", "create", "--tenant", "acme", "--json").json()
    cli.ok("keys", "revoke", revoked["key_id"], "--reason", "test")
    secret_file = tmp_path / "secret"
    secret_file.write_text(str(SECRET))
    cli.ok("keys", "import", "--tenant", "acme", "--secret-file", str(secret_file), "--algorithm", "gumbel",
           "--context-width", "4")
    token = cli.ok("tokens", "issue", "--tenant", "acme", "--json").json()
    cli.ok("tokens", "revoke", token["token_id"])
    bad_secret = tmp_path / "bad-secret"
    bad_secret.write_text("0xnot-a-key")

    cases = [
        (("tenants", "create", "acme"), "already exists"),
        (("tenants", "create", "bad name"), "invalid tenant name"),
        (("keys", "create", "--tenant", "nobody"), "unknown tenant 'nobody'"),
        (("keys", "create", "--tenant", "acme", "--context-width", "99"), "invalid watermark spec"),
        (("keys", "create", "--tenant", "acme", "--dedup-max-history", "lots"), "--dedup-max-history"),
        (("keys", "rotate", "--tenant", "keyless"), "has no active key"),
        (("keys", "rotate", "--tenant", "nobody"), "unknown tenant"),
        (("keys", "show", "key_nope"), "unknown key 'key_nope'"),
        (("keys", "revoke", "key_nope", "--reason", "x"), "unknown key"),
        (("keys", "revoke", revoked["key_id"], "--reason", "again"), "already revoked"),
        (("keys", "export", key["key_id"]), "--yes"),
        (("keys", "export", "key_nope", "--yes"), "unknown key"),
        (("keys", "import", "--tenant", "acme", "--secret-file", str(secret_file), "--algorithm", "gumbel",
          "--context-width", "4"), "already stored"),
        (("keys", "import", "--tenant", "acme", "--secret-file", str(bad_secret), "--algorithm", "gumbel",
          "--context-width", "4"), "does not hold a key"),
        (("keys", "import", "--tenant", "acme", "--secret-file", str(secret_file)), "--algorithm and --context-width"),
        (("keys", "import", "--tenant", "acme"), "exactly one of"),
        (("keys", "import", "--tenant", "acme", "--vllm-config", str(tmp_path / "none.json")), "does not exist"),
        (("keys", "list", "--tenant", "nobody"), "unknown tenant"),
        (("tokens", "issue"), "--tenant"),
        (("tokens", "issue", "--tenant", "nobody"), "unknown tenant"),
        (("tokens", "revoke", token["token_id"]), "already revoked"),
        (("tokens", "revoke", "tok_nope"), "unknown token"),
        (("audit", "list", "--tenant", "nobody"), "unknown tenant"),
        (("audit", "list", "--limit", "0"), "--limit"),
        (("kek", "generate", "--out", str(secret_file)), "already exists"),
    ]
    before = snapshot(database_url)
    for args, expected in cases:
        result = cli.fails(*args)
        assert expected in result.stderr, (args, result.stderr)
        assert str(SECRET) not in result.stderr
    assert snapshot(database_url) == before


KEK_CHANGING_COMMANDS = [
    ("keys", "create", "--tenant", "acme"),
    ("keys", "rotate", "--tenant", "acme"),
    ("keys", "export", "{key_id}", "--yes"),
    ("keys", "import", "--tenant", "acme", "--secret-file", "{secret_file}", "--algorithm", "gumbel",
     "--context-width", "4"),
    ("kek", "rotate", "--new-kek-file", "{new_kek}"),
]


def test_bad_kek_is_refused_naming_the_kek_and_changes_nothing(cli, database_url, tmp_path):
    key = _tenant_with_key(cli)
    secret_file = tmp_path / "secret"
    secret_file.write_text(str(SECRET))
    new_kek = _new_kek_file(tmp_path, "new.kek")
    short_file = tmp_path / "short.kek"
    short_file.write_text(base64.b64encode(os.urandom(16)).decode())
    short_file.chmod(0o600)
    kek_settings = {
        "wrong length": ({"HALLMARK_KEK": base64.b64encode(os.urandom(16)).decode()}, "16 bytes"),
        "too long": ({"HALLMARK_KEK": base64.b64encode(os.urandom(48)).decode()}, "48 bytes"),
        "not base64": ({"HALLMARK_KEK": "this is not base64!"}, "not valid base64"),
        "missing": ({"HALLMARK_KEK": None}, "no KEK configured"),
        "wrong kek": ({"HALLMARK_KEK": Kek.generate().to_base64()}, "KEK"),
        "short file": ({"HALLMARK_KEK": None, "HALLMARK_KEK_FILE": str(short_file)}, "16 bytes"),
        "missing file": ({"HALLMARK_KEK": None, "HALLMARK_KEK_FILE": str(tmp_path / "nope")}, "does not exist"),
    }
    before = snapshot(database_url)
    for label, (env, expected) in kek_settings.items():
        for template in KEK_CHANGING_COMMANDS:
            args = [a.format(key_id=key["key_id"], secret_file=secret_file, new_kek=new_kek) for a in template]
            result = cli.fails(*args, **env)
            assert "KEK" in result.stderr and expected in result.stderr, (label, args, result.stderr)
    # A bad *new* KEK file for rotation is refused the same way.
    assert "16 bytes" in cli.fails("kek", "rotate", "--new-kek-file", str(short_file)).stderr
    assert snapshot(database_url) == before


def test_unmigrated_database(monkeypatch, capsys, empty_database_url, kek):
    cli = Cli(monkeypatch, capsys)
    cli.env(HALLMARK_DATABASE_URL=empty_database_url, HALLMARK_KEK=kek.to_base64())
    for args in (("tenants", "list"), ("tenants", "create", "acme"), ("keys", "create", "--tenant", "acme"),
                 ("keys", "list"), ("tokens", "issue", "--admin"), ("audit", "list")):
        assert "hallmark db upgrade" in cli.fails(*args).stderr
    if empty_database_url.startswith("sqlite"):
        assert not Path(empty_database_url.removeprefix("sqlite:///")).exists()
    else:
        engine = create_engine(empty_database_url)
        assert inspect(engine).get_table_names() == []
        engine.dispose()


def _read_only_copy(sqlite_template: Path) -> tuple[Path, Path]:
    directory = Path(tempfile.mkdtemp(prefix="hallmark-ro-"))
    path = directory / "hallmark.db"
    shutil.copyfile(sqlite_template, path)
    path.chmod(0o444)
    directory.chmod(0o555)  # nor may SQLite create its -wal and -shm files beside it
    return directory, path


def _drop_file_override_capabilities() -> None:
    """Run in the child before exec: without CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and
    CAP_FOWNER even root obeys file modes (PR_CAPBSET_DROP, so exec cannot regain them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_read_only_database_file(monkeypatch, capsys, sqlite_template, kek):
    directory, path = _read_only_copy(sqlite_template)
    original = path.read_bytes()
    url = f"sqlite:///{path}"
    try:
        if os.geteuid() != 0:
            cli = Cli(monkeypatch, capsys)
            cli.env(HALLMARK_DATABASE_URL=url, HALLMARK_KEK=kek.to_base64())
            for args in (("tenants", "create", "acme"), ("keys", "list")):
                assert "read-only" in cli.fails(*args).stderr
        else:
            # File modes do not bind root: run the real CLI as root without the capabilities
            # that override them.
            env = {**os.environ, "HALLMARK_DATABASE_URL": url, "HALLMARK_KEK": kek.to_base64()}
            env.pop("HALLMARK_KEK_FILE", None)
            try:
                run = subprocess.run([sys.executable, "-m", "service.cli", "tenants", "create", "acme"],
                                     env=env, cwd=REPO, preexec_fn=_drop_file_override_capabilities,
                                     capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.SubprocessError) as exc:
                pytest.skip(f"cannot drop file capabilities here ({exc}); run the tests as a normal user")
            assert run.returncode != 0 and run.stdout == ""
            assert len(run.stderr.strip().splitlines()) == 1, run.stderr
            assert run.stderr.startswith("error: ") and "read-only" in run.stderr
        assert path.read_bytes() == original
        assert sorted(p.name for p in directory.iterdir()) == ["hallmark.db"]
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)


# --- secrets only where asked for ------------------------------------------------------


def test_no_output_but_export_contains_a_secret(cli, tmp_path):
    _tenant_with_key(cli)
    cli.ok("tenants", "create", "beta")
    secret_file = tmp_path / "secret"
    secret_file.write_text(hex(SECRET))
    cli.ok("keys", "import", "--tenant", "beta", "--secret-file", str(secret_file), "--algorithm", "gumbel",
           "--context-width", "4", "--json")
    cli.ok("keys", "rotate", "--tenant", "acme", "--json")
    cli.ok("keys", "create", "--tenant", "acme")
    keys = cli.ok("keys", "list", "--json").json()
    for key in keys:
        cli.ok("keys", "show", key["key_id"], "--json")
        cli.ok("keys", "show", key["key_id"])
    cli.ok("keys", "revoke", keys[0]["key_id"], "--reason", "x", "--json")
    cli.ok("keys", "list")
    cli.ok("tokens", "issue", "--tenant", "acme", "--json")
    cli.ok("tokens", "list", "--json")
    cli.ok("audit", "list", "--json")
    cli.ok("audit", "list")
    cli.ok("tenants", "list", "--json")
    cli.ok("kek", "rotate", "--new-kek-file", str(_new_kek_file(tmp_path, "n.kek")), "--json")
    cli.env(HALLMARK_KEK=None, HALLMARK_KEK_FILE=str(tmp_path / "n.kek"))
    cli.ok("audit", "list", "--json")
    outputs = list(cli.outputs)
    secrets_ = [cli.ok("keys", "export", k["key_id"], "--yes", "--json").json()["secret"] for k in keys]
    assert SECRET in secrets_ and len(secrets_) == 4
    for output in outputs:
        for secret in secrets_:
            for shown in (str(secret), f"{secret:x}", f"{secret:X}", f"{secret:016x}"):
                assert shown not in output
    # The exports themselves are audited, and the audit log still holds no secret.
    audit = cli.ok("audit", "list", "--json").stdout
    assert audit.count("key.exported") == 4
    assert not any(str(secret) in audit or f"{secret:x}" in audit for secret in secrets_)


def test_keys_create_explains_the_key_size(cli):
    cli.ok("tenants", "create", "sizes")
    text = cli.ok("keys", "create", "--tenant", "sizes").stdout
    assert "prf hmac-sha256-philox-v1 (256-bit key)" in text and "2**256 guesses" in text
    text = cli.ok("keys", "create", "--tenant", "sizes", "--prf", "philox").stdout
    assert "prf philox4x32-10-v1 (64-bit key)" in text and "H100" in text and "--prf hmac-sha256-philox-v1" in text
    assert "unknown prf" in cli.fails("keys", "create", "--tenant", "sizes", "--prf", "md5").stderr
