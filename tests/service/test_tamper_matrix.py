"""The tamper matrix (issue 21): every tampering the issue measured, on SQLite and on
PostgreSQL with the separated roles, against a stack populated through a running gateway.

Each case clones the populated database and tampers with it as one of the threat model's
actors could (tests/service/tamper.py, docs/how-to/verify.md):

- as the database owner or the gateway's role, without the KEK or the log key: `hallmark
  ledger verify` exits 1 naming it, and detection never cites the tampered entry (the log
  still holds what was written, so every receipt and the witness stay right);
- as the operator holding the log key, covering the tracks by rebuilding the log and signing
  it anew: the witness holding the earlier checkpoint exits 1 (fork or rollback), and so does
  `ledger verify --checkpoint <witness state>`; plain `ledger verify` cannot see it (the
  operator's rewrite is self-consistent: docs/concepts/threat-model.md says so plainly).

Truncation is also done the owner's best way: cut the tail and restore a head row saved
earlier (authentic, consistent): only a holder of a later checkpoint sees it.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledger.kgrams import find_matches
from ledger.entries import find_generations_by_output_hash, hash_output
from tests.keys.conftest import Cli
from tests.service import gateway
from tests.service.store_stack import provision_owned
from tests.service.tamper import Stack, entries, insert_entry, owner, rebuild_log, rechain

PROMPTS = ["The function returns", "Return a new list", "This module provides", "If the argument is"]


def _generate(url: str, token: str, prompt: str, seed: int, stream: bool = False) -> dict:
    body = {"prompt": prompt, "max_tokens": 40, "seed": seed, "stream": stream}
    headers = {"Authorization": f"Bearer {token}"}
    if not stream:
        response = httpx.post(url + "/v1/generate", json=body, headers=headers, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()
    done = None
    with httpx.stream("POST", url + "/v1/generate", json=body, headers=headers, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("type") == "done":
                done = json.loads(line[6:])
    assert done is not None
    return done


def _populate(stack: Stack, app_url: str, tokens: dict[str, str], services, cli: Cli) -> None:
    plan = [("acme", 0, False), ("acme", 1, False), ("globex", 2, False), ("acme", 3, True),
            ("globex", 4, False), ("acme", 5, False), ("acme", 6, False)]
    for i, (tenant, seed, stream) in enumerate(plan):
        out = _generate(app_url, tokens[tenant], PROMPTS[seed % 4], seed, stream)
        stack.generations.append({"id": out["generation_id"], "tenant": tenant, "text": out["text"],
                                  "token_ids": out["token_ids"], "receipt": out["receipt"]})
        if i == 2:
            services.publish_checkpoint()
            with create_engine(stack.url).connect() as connection:
                stack.early_head = dict(connection.execute(text("SELECT * FROM log_head")).one()._mapping)
    services.publish_checkpoint()
    witnessed = cli("ledger", "witness", "--state", str(stack.witness_state), "--json",
                    HALLMARK_DATABASE_URL=stack.url, HALLMARK_KEK_FILE=str(stack.kek_file))
    assert witnessed.exit_code == 0, witnessed.stderr


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stack(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"tamper-{request.param}")
    monkeypatch = pytest.MonkeyPatch()
    cli = Cli(monkeypatch, _Capture())
    try:
        if request.param == "sqlite":
            running = gateway.start(tmp)
            stack = Stack("sqlite", running.store_settings.database_url, None, running.store_settings.kek_file, tmp,
                          tmp / "witness.json", {}, [])
            stop = running.stop
            app, url, tokens = running.app, running.url, running.tokens
        else:
            from tests.keys.conftest import reachable_pg_server

            server = reachable_pg_server()
            stack, app, url, tokens, stop = _postgres_stack(server, tmp)
        _populate(stack, url, tokens, app.state.services, cli)
        stop()
        yield stack
    finally:
        if request.param == "postgres" and stack is not None and stack.server is not None:
            stack.server.close()
        monkeypatch.undo()


class _Capture:
    """capsys for a module-scoped Cli: the in-process CLI's output, captured by redirection."""

    def __init__(self) -> None:
        import io

        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self):
        out, err = self.out.getvalue(), self.err.getvalue()
        self.out.seek(0), self.out.truncate(), self.err.seek(0), self.err.truncate()
        return type("Captured", (), {"out": out, "err": err})()


def _postgres_stack(server, tmp: Path):
    from keys.settings import StoreSettings
    from service.app import create_app
    from service.settings import ServiceSettings

    name, owner_url, role, store_settings, tokens = provision_owned(server, tmp, with_log=False)
    service_url = make_url(owner_url).set(username=role).render_as_string(hide_password=False)
    settings = ServiceSettings(model=gateway.TEST_MODEL, draft_model=gateway.TEST_DRAFT, device="cpu", max_batch=8,
                               detect_rate_per_minute=100_000, detect_burst=100_000)
    app = create_app(settings, store_settings=StoreSettings(database_url=service_url,
                                                            kek_file=store_settings.kek_file))
    url, uvicorn_server, thread = gateway.serve(app)

    def stop() -> None:
        uvicorn_server.should_exit = True
        thread.join(60)
        with server.engine.connect() as connection:
            connection.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")

    stack = Stack("postgres", owner_url, service_url, store_settings.kek_file, tmp, tmp / "witness.json", {}, [],
                  server=server)
    return stack, app, url, tokens, stop


@pytest.fixture
def cli(monkeypatch, capsys):
    return Cli(monkeypatch, capsys)


def _verify(cli: Cli, stack: Stack, url: str, *args: str):
    return cli("ledger", "verify", *args, HALLMARK_DATABASE_URL=url, HALLMARK_KEK_FILE=str(stack.kek_file))


def _witness(cli: Cli, stack: Stack, url: str, tmp_path: Path):
    state = tmp_path / "witness.json"
    shutil.copyfile(stack.witness_state, state)
    before = state.read_text()
    result = cli("ledger", "witness", "--state", str(state), HALLMARK_DATABASE_URL=url,
                 HALLMARK_KEK_FILE=str(stack.kek_file))
    if result.exit_code:
        assert state.read_text() == before  # a refusal keeps the old state
    return result


def _cited(stack: Stack, url: str, text_: str) -> list[str]:
    from keys.db import open_store
    from keys.settings import StoreSettings

    store = open_store(StoreSettings(database_url=url, kek_file=stack.kek_file), require_kek=True)
    try:
        with store.transaction(write=False) as session:
            return [g.id for g in find_generations_by_output_hash(session, output_sha256=hash_output(text_),
                                                                  tenant_id=None)]
    finally:
        store.close()


def _one_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.stdout
    assert all(n in result.stderr for n in needles), result.stderr


def _middle(stack: Stack, tenant: str = "acme") -> dict:
    mine = [g for g in stack.generations if g["tenant"] == tenant]
    return mine[len(mine) // 2]


# --- the cases ----------------------------------------------------------------------------------


def _edit(connection, generation_id: str, new_text: str) -> str:
    row = connection.execute(text("SELECT tenant_id FROM ledger_entries WHERE generation_id = :g"),
                             {"g": generation_id}).first()
    connection.execute(text("UPDATE ledger_entries SET output_sha256 = :h WHERE generation_id = :g AND kind = 'finished'"),
                       {"h": hash_output(new_text), "g": generation_id})
    rechain(connection, row[0])
    return row[0]


CASES = {}


def case(name):
    def register(fn):
        CASES[name] = fn
        return fn
    return register


@case("edit a middle entry and re-chain")
def _edit_middle(stack, url):
    target = _middle(stack)
    with owner(url) as connection:
        _edit(connection, target["id"], "an edited text")
    return {"verify": ["differs from what the log holds"], "uncited": ["an edited text"]}


@case("edit the newest entry")
def _edit_newest(stack, url):
    target = stack.generations[-1]
    with owner(url) as connection:
        _edit(connection, target["id"], "the newest, edited")
    return {"verify": ["differs from what the log holds"], "uncited": ["the newest, edited"]}


@case("delete a middle entry and renumber")
def _delete_middle(stack, url):
    target = _middle(stack)
    with owner(url) as connection:
        tenant_id = connection.execute(text("SELECT tenant_id FROM ledger_entries WHERE generation_id = :g"),
                                       {"g": target["id"]}).scalar()
        connection.execute(text("DELETE FROM ledger_entries WHERE generation_id = :g"), {"g": target["id"]})
        connection.execute(text("DELETE FROM ledger_kgrams WHERE generation_id = :g"), {"g": target["id"]})
        rechain(connection, tenant_id)
    return {"verify": ["is gone: deleted"]}


@case("cut off the newest entries")
def _truncate(stack, url):
    with owner(url) as connection:
        doomed = [g["id"] for g in stack.generations[-2:]]
        for generation_id in doomed:
            connection.execute(text("DELETE FROM ledger_kgrams WHERE generation_id = :g"), {"g": generation_id})
            connection.execute(text("DELETE FROM ledger_entries WHERE generation_id = :g"), {"g": generation_id})
    return {"verify": ["is gone: deleted"]}


@case("delete a tenant's whole chain")
def _delete_tenant(stack, url):
    with owner(url) as connection:
        connection.execute(text("DELETE FROM ledger_kgrams WHERE tenant_id IN (SELECT id FROM tenants WHERE name = 'globex')"))
        connection.execute(text("DELETE FROM ledger_entries WHERE tenant_id IN (SELECT id FROM tenants WHERE name = 'globex')"))
    return {"verify": ["tenant 'globex'", "is gone: deleted"], "tenant": "globex"}


@case("append a forged generation")
def _forge(stack, url):
    # The gateway's own role can do this one on PostgreSQL (INSERT on ledger_entries).
    target = stack.service_url and make_url(url).set(username=make_url(stack.service_url).username)
    engine = create_engine(target.render_as_string(hide_password=False) if target else url)
    with engine.begin() as connection:
        last = entries(connection, "acme")[-1]
        forged = dict(last, generation_id="f" * 32, seq=last["seq"] + 1, prev_hash=last["entry_hash"],
                      output_sha256=hash_output("a forged generation"))
        forged.pop("id")
        from ledger.chain import entry_fields, entry_hash
        from tests.service.tamper import _aware

        forged["entry_hash"] = entry_hash(entry_fields(type("Row", (), _aware(forged))))
        insert_entry(connection, forged)
    engine.dispose()
    return {"verify": ["not in the log: inserted"], "uncited": ["a forged generation"], "no_rebuild": True}


def _middle_with_kgrams(stack: Stack, tenant: str = "acme") -> dict:
    """The middle one of ``tenant``'s generations long enough to have recorded k-grams (the
    keys are random, so a generation may stop after a few tokens and record none)."""
    from ledger.kgrams import K

    def kgrams(ids: list[int]) -> int:
        return len({tuple(ids[i:i + K]) for i in range(len(ids) - K + 1)})

    mine = [g for g in stack.generations if g["tenant"] == tenant and kgrams(g["token_ids"]) >= 5]
    assert mine, "no generation of this stack recorded k-grams"
    return mine[len(mine) // 2]


@case("delete k-gram rows")
def _delete_kgrams(stack, url):
    target = _middle_with_kgrams(stack)
    if stack.service_url:  # the gateway's role may not: refused
        service = make_url(url).set(username=make_url(stack.service_url).username)
        engine = create_engine(service.render_as_string(hide_password=False))
        with pytest.raises(Exception, match="permission denied"):
            with engine.begin() as connection:
                connection.execute(text("DELETE FROM ledger_kgrams"))
        engine.dispose()
    with owner(url) as connection:
        deleted = connection.execute(text("DELETE FROM ledger_kgrams WHERE id IN (SELECT id FROM ledger_kgrams "
                                          "WHERE generation_id = :g ORDER BY id LIMIT 5)"), {"g": target["id"]})
        assert deleted.rowcount == 5  # the tampering happened (a no-op would make the case vacuous)
    return {"verify": ["k-gram rows of generation " + target["id"]], "kgrams_uncited": target}


@case("reorder entries")
def _reorder(stack, url):
    with owner(url) as connection:
        acme = [e for e in entries(connection, "acme") if e["kind"] == "finished"]
        a, b = acme[0], acme[1]
        connection.execute(text("UPDATE ledger_entries SET seq = 999999 WHERE id = :id"), {"id": a["id"]})
        connection.execute(text("UPDATE ledger_entries SET seq = :s WHERE id = :id"), {"s": a["seq"], "id": b["id"]})
        connection.execute(text("UPDATE ledger_entries SET seq = :s WHERE id = :id"), {"s": b["seq"], "id": a["id"]})
        rechain(connection, a["tenant_id"])
    return {"verify": ["differs from what the log holds"]}


@pytest.mark.parametrize("name", list(CASES))
def test_tampering_is_reported(stack, name, cli, tmp_path):
    url = stack.clone(f"c{list(CASES).index(name)}_{secrets.token_hex(2)}")
    clean = _verify(cli, stack, url)
    assert clean.exit_code == 0, clean.stderr
    expect = CASES[name](stack, url)
    # Actor d (or c): rows changed without the log key. `ledger verify` names it...
    result = _verify(cli, stack, url)
    _one_error(result, *expect["verify"])
    if expect.get("tenant"):
        by_tenant = _verify(cli, stack, url, "--tenant", expect["tenant"])
        assert by_tenant.exit_code == 1 and f"tenant {expect['tenant']}: 0 entries (" in by_tenant.stdout
        assert "(0 in the log)" not in by_tenant.stdout
    # ... detection never cites what the log does not hold as written ...
    for text_ in expect.get("uncited", ()):
        assert _cited(stack, url, text_) == []
    if expect.get("kgrams_uncited"):
        _assert_kgrams_uncited(stack, url, expect["kgrams_uncited"])
    # ... and the log itself is untouched: the witness agrees, every receipt still verifies.
    assert _witness(cli, stack, url, tmp_path).exit_code == 0
    if expect.get("no_rebuild"):
        return  # appending a false new entry is what actor e *can* do (docs/concepts/threat-model.md says so plainly)
    # Actor e covers the tracks: rebuilds the log over the tampered rows with the log key and
    # signs it. Self-consistent, so plain verify passes; the witness and its checkpoint do not.
    rebuild_log(url, stack.kek_file)
    assert _verify(cli, stack, url).exit_code == 0
    witness = _witness(cli, stack, url, tmp_path)
    _one_error(witness, "error: ")
    assert ("fork" in witness.stderr) or ("rollback" in witness.stderr)
    pinned = _verify(cli, stack, url, "--checkpoint", str(stack.witness_state))
    _one_error(pinned, f"checkpoint {stack.witness_state}")


def _assert_kgrams_uncited(stack: Stack, url: str, generation: dict) -> None:
    from keys.db import open_store
    from keys.material import detection_keys
    from keys.settings import StoreSettings

    store = open_store(StoreSettings(database_url=url, kek_file=stack.kek_file), require_kek=True)
    try:
        with store.transaction(write=False) as session:
            keys = [(k.key_id, k.material.secret) for k in detection_keys(session, store.keyring, tenant="acme")]
            found = find_matches(session, keys=keys, token_ids=generation["token_ids"], tenant_id=None)
    finally:
        store.close()
    assert generation["id"] not in {m.generation_id for m in found}


def test_truncation_with_a_restored_head_is_seen_only_from_a_later_checkpoint(stack, cli, tmp_path):
    """The owner's best truncation: cut the tail and every log row after an earlier size,
    restore the head row saved then (authentic: it was the log's own). Consistent, so
    `ledger verify` alone passes; the witness reports the rollback, and `ledger verify
    --checkpoint` with the witness's checkpoint (or a receipt's) names it."""
    url = stack.clone(f"trunc_{secrets.token_hex(2)}")
    early = stack.early_head["size"]
    with owner(url) as connection:
        ids = [row[0] for row in connection.execute(text("SELECT entry_id FROM log_leaves WHERE idx >= :n AND entry_id IS NOT NULL"),
                                                    {"n": early})]
        generations = {row[0] for row in connection.execute(
            text("SELECT generation_id FROM ledger_entries WHERE id IN :ids").bindparams(
                __import__("sqlalchemy").bindparam("ids", expanding=True)), {"ids": ids or [-1]})}
        for generation_id in generations:
            connection.execute(text("DELETE FROM ledger_kgrams WHERE generation_id = :g"), {"g": generation_id})
        connection.execute(text("DELETE FROM ledger_entries WHERE id IN :ids").bindparams(
            __import__("sqlalchemy").bindparam("ids", expanding=True)), {"ids": ids or [-1]})
        connection.execute(text("DELETE FROM log_leaves WHERE idx >= :n"), {"n": early})
        for level in range(1, 40):
            connection.execute(text("DELETE FROM log_nodes WHERE level = :l AND (idx + 1) * :w > :n"),
                               {"l": level, "w": 1 << level, "n": early})
        connection.execute(text("DELETE FROM log_checkpoints WHERE size > :n"), {"n": early})
        connection.execute(text("UPDATE log_head SET size = :size, border = :border, mac = :mac"),
                           {k: stack.early_head[k] for k in ("size", "border", "mac")})
    assert _verify(cli, stack, url).exit_code == 0  # the stated limit of an audit of the database alone
    witness = _witness(cli, stack, url, tmp_path)
    _one_error(witness, "rollback")
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps(stack.generations[-1]["receipt"]))
    _one_error(_verify(cli, stack, url, "--checkpoint", str(receipt)), "entries were cut off")


def test_a_forged_generation_is_never_cited_by_the_running_gateway(tmp_path):
    """The issue's attack against a running stack: a chained generation inserted with the
    database's credentials; /v1/detect cited it as an exact ledger match in its signed report."""
    running = gateway.start(tmp_path)
    try:
        acme = {"Authorization": f"Bearer {running.tokens['acme']}"}
        real = _generate(running.url, running.tokens["acme"], "The function returns", 11)
        forged_text = "A paragraph a person wrote, now claimed as a watermarked generation."
        with owner(running.store_settings.database_url) as connection:
            last = entries(connection, "acme")[-1]
            from ledger.chain import entry_fields, entry_hash
            from tests.service.tamper import _aware

            forged = dict(last, generation_id="e" * 32, seq=last["seq"] + 1, prev_hash=last["entry_hash"],
                          output_sha256=hash_output(forged_text), kind="finished", finish_reason="stop")
            forged.pop("id")
            forged["entry_hash"] = entry_hash(entry_fields(type("Row", (), _aware(forged))))
            insert_entry(connection, forged)
        for text_, cited in ((forged_text, []), (real["text"], [real["generation_id"]])):
            result = httpx.post(running.url + "/v1/detect", json={"text": text_}, headers=acme, timeout=120).json()
            assert [m["generation_id"] for m in result["ledger_matches"]] == cited
            signed = result["report"]["statement"]  # what the signed report says it rests on
            assert [m["generation_id"] for m in signed["result"]["ledger_matches"]] == cited
            assert ("ledger" in signed["basis"]) == bool(cited)
    finally:
        running.stop()
