"""A new user's first hour with the CLI: usage errors, the shared development KEK,
`hallmark doctor`, and progress lines that stay off the record when output is not a terminal."""

from __future__ import annotations

import json

import re
import sqlite3
import sys

import pytest

from keys.kek import ensure_dev_kek_file
from service.cli import main


@pytest.fixture
def fresh_dir(tmp_path, monkeypatch):
    """An empty working directory and no HALLMARK_* settings: what `make run`'s user has."""
    import os

    for name in list(os.environ):
        if name.startswith("HALLMARK_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["hallmark", *argv])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv, usage", [
    (["nosuch"], "Usage: hallmark [OPTIONS] COMMAND"),
    (["keys", "create", "--tenant"], "Usage: hallmark keys create [OPTIONS]"),
    (["tenants", "create"], "Usage: hallmark tenants create"),
    (["keys", "create", "--nosuch", "x"], "Usage: hallmark keys create"),
])
def test_usage_errors_print_usage_and_one_error_line(monkeypatch, capsys, fresh_dir, argv, usage):
    code, out, err = run(monkeypatch, capsys, *argv)
    assert code == 2 and "Traceback" not in err + out
    assert usage in err
    assert [line for line in err.splitlines() if line.startswith("Error:")] == [err.splitlines()[-1]]


def test_cli_finds_the_kek_that_make_run_made(monkeypatch, capsys, fresh_dir):
    assert run(monkeypatch, capsys, "db", "upgrade")[0] == 0
    assert run(monkeypatch, capsys, "tenants", "create", "acme")[0] == 0
    # Without var/kek.key: the hint names the file the server uses, not a new KEK.
    code, _, err = run(monkeypatch, capsys, "keys", "create", "--tenant", "acme")
    assert code == 1 and "var/kek.key" in err and "Traceback" not in err and len(err.splitlines()) == 1
    # What `hallmark quickstart` (make run) leaves behind: var/kek.key beside var/hallmark.db.
    kek = ensure_dev_kek_file(fresh_dir / "var" / "kek.key")
    code, out, err = run(monkeypatch, capsys, "keys", "create", "--tenant", "acme", "--json")
    assert code == 0, err
    assert '"state": "active"' in out and kek.id in out


def test_a_configured_database_elsewhere_does_not_borrow_the_dev_kek(monkeypatch, capsys, fresh_dir):
    ensure_dev_kek_file(fresh_dir / "var" / "kek.key")
    monkeypatch.setenv("HALLMARK_DATABASE_URL", f"sqlite:///{fresh_dir / 'prod.db'}")
    assert run(monkeypatch, capsys, "db", "upgrade")[0] == 0
    assert run(monkeypatch, capsys, "tenants", "create", "acme")[0] == 0
    code, _, err = run(monkeypatch, capsys, "keys", "create", "--tenant", "acme")
    assert code == 1 and "no KEK configured" in err


def test_doctor_says_what_to_fix_then_passes(monkeypatch, capsys, fresh_dir):
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1
    assert "FAIL  database" in out and "hallmark db upgrade" in out and "FAIL  kek" in out
    assert "ok    model        hallmark-tiny-dsv32" in out
    ensure_dev_kek_file(fresh_dir / "var" / "kek.key")
    assert run(monkeypatch, capsys, "db", "upgrade")[0] == 0
    code, out, _ = run(monkeypatch, capsys, "doctor", "--json")
    assert code == 0 and '"ok": true' in out
    # A KEK that opens none of the stored keys is named as the problem.
    assert run(monkeypatch, capsys, "tenants", "create", "acme")[0] == 0
    assert run(monkeypatch, capsys, "keys", "create", "--tenant", "acme")[0] == 0
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 0 and "no transparency-log key yet" in out, out
    assert run(monkeypatch, capsys, "ledger", "init")[0] == 0
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 0 and re.search(r"ok    log key +the transparency log \S+ opens under the KEK", out), out
    other = ensure_dev_kek_file(fresh_dir / "other.key")
    monkeypatch.setenv("HALLMARK_KEK", other.to_base64())
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1 and "does not open the stored keys" in out
    # A log key whose sealed row was altered is named, with what to do.
    monkeypatch.delenv("HALLMARK_KEK")
    with sqlite3.connect(fresh_dir / "var" / "hallmark.db") as db:
        db.execute("UPDATE log_keys SET wrapped_private = zeroblob(length(wrapped_private))")
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1 and "FAIL  log key" in out and "restore the log_keys row" in out, out


def test_progress_stays_off_without_a_terminal(monkeypatch, capsys, fresh_dir):
    from service.cli import progress

    lines = fresh_dir / "batch.jsonl"
    lines.write_text('{"key": "7", "context": [1, 2, 3, 4], "tokens": [5]}\n' * 3)
    code, out, err = run(monkeypatch, capsys, "prf", "--jsonl", str(lines))
    assert code == 0 and len(out.splitlines()) == 3 and err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert progress.enabled() and not progress.enabled(as_json=True)


@pytest.mark.slow
def test_generate_json_writes_nothing_on_stderr_without_a_terminal(fresh_dir):
    """`hallmark generate --json` in a pipe: the JSON on stdout and nothing on stderr (before,
    transformers drew its "Loading weights" bars there whatever stderr was)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    ensure_dev_kek_file(fresh_dir / "var" / "kek.key")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "service.cli", *argv], cwd=fresh_dir, env=env,
                              capture_output=True, text=True, timeout=600)

    for argv in (["db", "upgrade"], ["tenants", "create", "t"], ["keys", "create", "--tenant", "t"]):
        assert cli(*argv).returncode == 0
    run = cli("generate", "--tenant", "t", "--prompt", "The function returns", "--max-tokens", "4", "--json")
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert json.loads(run.stdout)["generations"][0]["output_tokens"] >= 1


@pytest.mark.parametrize("command", ["serve", "quickstart"])
@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_a_port_outside_1_65535_is_a_usage_error(monkeypatch, capsys, fresh_dir, command, port):
    """Before, `hallmark serve --port 99999` loaded the model and listened on 34463 (99999 mod
    65536) without a word."""
    code, _, err = run(monkeypatch, capsys, command, "--port", port)
    assert code == 2 and "Invalid value for '--port'" in err and "Traceback" not in err
    assert not (fresh_dir / "var").exists()


def test_every_command_that_prints_json_takes_json(monkeypatch, capsys, fresh_dir):
    """docs/reference/cli.md: "Every command takes --json". `prf` and `signing-keys export-public` print JSON
    anyway but refused the flag (usage error, exit 2); with it, prf's line counter stays off
    even on a terminal."""
    import json

    ensure_dev_kek_file(fresh_dir / "var" / "kek.key")
    assert run(monkeypatch, capsys, "db", "upgrade")[0] == 0
    code, out, _ = run(monkeypatch, capsys, "signing-keys", "export-public", "--json")
    assert code == 0 and "keys" in json.loads(out)
    lines = fresh_dir / "cases.jsonl"
    lines.write_text('{"key": "7", "context": [1, 2, 3, 4], "tokens": [5]}\n' * 2)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    code, out, err = run(monkeypatch, capsys, "prf", "--jsonl", str(lines), "--json")
    assert code == 0 and [set(json.loads(line)) for line in out.splitlines()] == [{"words", "uniforms"}] * 2
    assert err == ""


def _store_with_tenant(monkeypatch, capsys, fresh_dir, tenant: str = "acme") -> None:
    ensure_dev_kek_file(fresh_dir / "var" / "kek.key")
    assert run(monkeypatch, capsys, "db", "upgrade")[0] == 0
    assert run(monkeypatch, capsys, "tenants", "create", tenant)[0] == 0


def test_keys_create_keeps_the_tenants_spec_and_says_so(monkeypatch, capsys, fresh_dir):
    """Issue 25, item 4: after revoking a tenant's dual-key key, the hint's `hallmark keys
    create --tenant acme` made a single-key gumbel key (which turns speculation off) without
    a word. The new key keeps the current spec unless an option changes it, and the output
    says which spec it got and where it came from."""
    import json

    _store_with_tenant(monkeypatch, capsys, fresh_dir)
    code, out, err = run(monkeypatch, capsys, "keys", "create", "--tenant", "acme", "--algorithm", "dual_key_gumbel",
                         "--coin", "keyed", "--context-width", "3")
    assert code == 0, err
    assert "spec: dual_key_gumbel, context width 3" in out and "coin keyed" in out
    assert "from the defaults with --algorithm, --context-width, --coin given (the tenant's first key)" in out
    first = json.loads(run(monkeypatch, capsys, "keys", "list", "--tenant", "acme", "--json")[1])[0]

    code, out, _ = run(monkeypatch, capsys, "keys", "revoke", first["key_id"], "--reason", "leaked")
    assert code == 0 and "create one with `hallmark keys create --tenant acme`" in out
    code, out, err = run(monkeypatch, capsys, "keys", "create", "--tenant", "acme")  # the hint, as given
    assert code == 0, err
    assert out.splitlines()[0].startswith("created key ") and ", active," in out.splitlines()[0]
    assert (f"from the spec of key {first['key_id']} (version 1, revoked), unchanged") in out
    second = json.loads(run(monkeypatch, capsys, "keys", "list", "--tenant", "acme", "--json")[1])[1]
    assert second["state"] == "active" and second["spec"] == first["spec"]
    assert second["spec"]["algorithm"] == "dual_key_gumbel" and second["spec"]["coin"] == "keyed"

    # Told otherwise: only what the options name changes; with an active key present, the
    # active key's spec is the base and the new key is verify-only.
    code, out, err = run(monkeypatch, capsys, "keys", "create", "--tenant", "acme", "--algorithm", "gumbel",
                         "--coin", "ordinary", "--json")
    assert code == 0, err
    third = json.loads(out)
    assert third["state"] == "verify-only" and third["spec_source"]["key_id"] == second["key_id"]
    assert third["spec"] == {**second["spec"], "algorithm": "gumbel", "coin": "ordinary"}
    # A change the spec refuses is one line and creates nothing.
    code, _, err = run(monkeypatch, capsys, "keys", "create", "--tenant", "acme", "--algorithm", "gumbel")
    assert code == 1 and len(err.splitlines()) == 1 and "keyed acceptance coin needs" in err
    assert len(json.loads(run(monkeypatch, capsys, "keys", "list", "--tenant", "acme", "--json")[1])) == 3


def test_detect_text_reads_with_the_served_models_tokenizer_by_default(monkeypatch, capsys, fresh_dir):
    """Issue 25, item 7: `hallmark detect --text-file F` without --tokenizer failed with
    "--text needs --tokenizer" without naming the value to give. It now reads the text with
    the served model's tokenizer (HALLMARK_MODEL, else the bundled model's), as /v1/detect
    does, and a tokenizer that cannot load is named with where it came from."""
    import json

    from service.tokenization import load_tokenizer

    _store_with_tenant(monkeypatch, capsys, fresh_dir)
    assert run(monkeypatch, capsys, "keys", "create", "--tenant", "acme")[0] == 0
    doc = fresh_dir / "doc.txt"
    doc.write_text("The function returns the number of bytes written to the stream, or raises an error.\n")
    code, out, err = run(monkeypatch, capsys, "detect", "--tenant", "acme", "--text-file", str(doc), "--json")
    assert code == 0, err
    default = json.loads(out)
    code, out, err = run(monkeypatch, capsys, "detect", "--tenant", "acme", "--text-file", str(doc), "--tokenizer",
                         "bundled", "--json")
    assert code == 0, err
    assert json.loads(out) == default
    assert default["total_tokens"] == len(load_tokenizer("bundled")(doc.read_text())["input_ids"])

    monkeypatch.setenv("HALLMARK_MODEL", str(fresh_dir / "no-such-model"))
    code, _, err = run(monkeypatch, capsys, "detect", "--tenant", "acme", "--text-file", str(doc))
    assert code == 1 and len(err.splitlines()) == 1
    assert "(the served model's, from HALLMARK_MODEL): no such directory" in err and "--tokenizer bundled" in err


def test_a_bad_log_setting_is_one_line_naming_the_variable(monkeypatch, capsys, fresh_dir):
    """HALLMARK_LOG_FORMAT (issue 25, item 12) and every other setting: one line naming the
    variable, before any port is bound or model loaded (before: pydantic's four-line dump)."""
    ensure_dev_kek_file(fresh_dir / "var" / "kek.key")
    assert run(monkeypatch, capsys, "db", "upgrade")[0] == 0
    monkeypatch.setenv("HALLMARK_LOG_FORMAT", "xml")
    import socket

    with socket.socket() as busy:  # were the setting ignored, serving would stop here, not hang
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code, out, err = run(monkeypatch, capsys, "serve", "--port", str(busy.getsockname()[1]))
    assert code == 1 and out == ""
    assert err == "error: invalid setting HALLMARK_LOG_FORMAT: Input should be 'text' or 'json'\n"


def test_doctor_elsewhere_says_where_the_store_is_instead_of_making_a_second(monkeypatch, capsys, fresh_dir):
    """Issue 34, item 10: `hallmark doctor` run outside the directory of `make run` suggested
    `hallmark db upgrade`, which creates a second, empty store there. It now names the
    directory that holds the store when it is above this one, and otherwise says that an
    upgrade here would start a new, empty store; other commands say the same, and none of
    them creates anything."""
    _store_with_tenant(monkeypatch, capsys, fresh_dir)
    below = fresh_dir / "docs" / "notes"
    below.mkdir(parents=True)
    monkeypatch.chdir(below)
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1 and f"FAIL  database     no store in {below} (no var/hallmark.db); there is one in {fresh_dir}" in out
    assert f"fix: run hallmark from {fresh_dir} (`cd {fresh_dir}`)" in out and "db upgrade" not in out, out
    code, _, err = run(monkeypatch, capsys, "keys", "list")
    assert code == 1 and len(err.splitlines()) == 1 and f"there is one in {fresh_dir}" in err, err
    elsewhere = fresh_dir.parent / (fresh_dir.name + "-elsewhere")
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1 and "if you ran `make run`, run hallmark from that directory" in out
    assert "`hallmark db upgrade` here would start a new, empty store" in out
    assert not (below / "var").exists() and not (elsewhere / "var").exists()
    # In a checkout without a store yet, creating one is the right advice.
    (elsewhere / "pyproject.toml").write_text('[project]\nname = "hallmark"\n')
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1 and "fix: run `hallmark db upgrade` (or `make run`)" in out


def test_keys_list_has_a_mode_column(monkeypatch, capsys, fresh_dir):
    """Issue 34, item 10: `keys list` did not say which keys salt their generations."""
    _store_with_tenant(monkeypatch, capsys, fresh_dir)
    assert run(monkeypatch, capsys, "keys", "create", "--tenant", "acme", "--mode", "diverse")[0] == 0
    assert run(monkeypatch, capsys, "keys", "create", "--tenant", "acme", "--mode", "deterministic")[0] == 0
    code, out, _ = run(monkeypatch, capsys, "keys", "list")
    header, *rows = out.splitlines()
    assert code == 0 and header.split()[6] == "MODE", header
    assert [row.split()[6] for row in rows] == ["diverse", "deterministic"], out


def test_detect_says_a_short_text_may_be_missed_and_counts_keys_not_salts(monkeypatch, capsys, fresh_dir):
    """Issue 34, items 5 and 10: `hallmark detect` said "not watermarked" of a 7-token text
    without saying that so few tokens rarely pass, and counted a diverse key's 16 salts as
    16 keys."""
    _store_with_tenant(monkeypatch, capsys, fresh_dir)
    # --dedup single_turn: a diverse key of the salt scheme, tested under each of its 16 salts
    # (a new diverse key's default, the head scheme, is one test: watermark/head.py).
    assert run(monkeypatch, capsys, "keys", "create", "--tenant", "acme", "--mode", "diverse",
               "--dedup", "single_turn")[0] == 0
    code, out, err = run(monkeypatch, capsys, "detect", "--tenant", "acme", "--text", "The function returns a list.")
    assert code == 0, err
    assert out.startswith("not watermarked: ") and ", 1 key tested under 16 salts" in out, out
    assert "too short to say: a watermarked text usually needs 50 or more scored tokens" in out
    # The JSON counts the same way (as HTTP does): keys in keys_tested, (key, salt) tests in tests.
    code, out, err = run(monkeypatch, capsys, "detect", "--tenant", "acme", "--text", "The function returns a list.",
                         "--json")
    assert code == 0, err
    assert (json.loads(out)["keys_tested"], json.loads(out)["tests"]) == (1, 16), out
