"""`hallmark ledger witness` against the database (no URL) on both databases: a rollback, a
fork, a failed proof each exit 1 with one line and keep the state; gossip between two
witnesses (--peer) catches the split view that each alone accepts. `ledger checkpoint`."""

from __future__ import annotations

import json
import shutil

from ledger.log import tlog
from tests.service.tamper import owner, rebuild_log, rechain


def _record(store, tenant_id: str, text_: str) -> None:
    from ledger.entries import record_generation

    with store.transaction() as session:
        record_generation(session, tenant_id=tenant_id, key_id=None, key_version=None, engine="local", model="m",
                          spec=None, prompt_tokens=1, watermarked_tokens=0, unwatermarked_reason="opt_out",
                          output_text=text_, token_ids=[1, 2])
        tlog.publish(session, tlog.required_authority(session))


def test_rollback_fork_failed_proof_and_split_view_from_the_database(tmp_path, cli, store, two_tenants,
                                                                      database_url, kek):
    made = two_tenants()
    env = {"HALLMARK_DATABASE_URL": database_url, "HALLMARK_KEK": kek.to_base64()}
    for i in range(5):
        _record(store, made.acme.id, f"entry {i}")
    state = tmp_path / "a.json"
    assert cli("ledger", "witness", "--state", str(state), **env).exit_code == 0
    stale = tmp_path / "stale.json"  # a witness that saw size 5 and then stopped looking
    shutil.copyfile(state, stale)
    checkpoint = cli.ok("ledger", "checkpoint", "--json", **env).json()
    assert checkpoint["size"] == json.loads(state.read_text())["size"] and checkpoint["log_key"]
    assert cli.ok("ledger", "checkpoint", **env).stdout == checkpoint["checkpoint"]
    for i in range(5, 8):
        _record(store, made.acme.id, f"entry {i}")
    peer = tmp_path / "b.json"  # a second witness, which saw the log later
    assert cli("ledger", "witness", "--state", str(peer), "--trust-log-key", str(state), **env).exit_code == 0
    ok = cli.ok("ledger", "witness", "--state", str(state), "--peer", str(peer), **env)
    assert "one history" in ok.stdout or "same checkpoint" in ok.stdout

    # A failed proof: a stored subtree under the checkpoint the witness saw, rewritten.
    from sqlalchemy import text

    with owner(database_url) as connection:
        original = connection.execute(text("SELECT hash FROM log_nodes WHERE level = 2 AND idx = 0")).scalar()
        connection.execute(text("UPDATE log_nodes SET hash = :h WHERE level = 2 AND idx = 0"), {"h": b"\1" * 32})
    stale_state = json.loads(stale.read_text())
    stale_doc = stale.read_text()
    for i in range(8, 9):
        _record(store, made.acme.id, f"entry {i}")
    failed = cli.fails("ledger", "witness", "--state", str(stale), **env)
    assert "fork" in failed.stderr and stale.read_text() == stale_doc and stale_state["size"] == 5
    with owner(database_url) as connection:
        connection.execute(text("UPDATE log_nodes SET hash = :h WHERE level = 2 AND idx = 0"), {"h": original})
    # The operator rebuilds the log after rewriting one entry's row: a fork for the witness...
    with owner(database_url) as connection:
        connection.exec_driver_sql("UPDATE ledger_entries SET output_tokens = output_tokens + 1 "
                                   "WHERE seq = 2")
        rechain(connection, made.acme.id)
    rebuild_log(database_url, kek=kek)
    for i in range(9, 11):
        _record(store, made.acme.id, f"entry {i}")
    before = state.read_text()
    forked = cli.fails("ledger", "witness", "--state", str(state), **env)
    assert "fork" in forked.stderr and state.read_text() == before
    # ... and a witness that first saw the log after the rewrite agrees with it, until the
    # two compare notes: gossip names the split view.
    late = tmp_path / "late.json"
    cli.ok("ledger", "witness", "--state", str(late), "--trust-log-key", str(state), **env)
    split = cli.fails("ledger", "witness", "--state", str(late), "--peer", str(state), **env)
    assert "split view" in split.stderr
    # A rollback: the log serves an older checkpoint (its own, validly signed) than the witness saw.
    import base64

    with owner(database_url) as connection:
        connection.exec_driver_sql("DELETE FROM log_checkpoints")
        connection.execute(text("INSERT INTO log_checkpoints (size, root, note, published_at) "
                                "VALUES (:s, :r, :n, CURRENT_TIMESTAMP)"),
                           {"s": stale_state["size"], "r": base64.b64decode(stale_state["root"]),
                            "n": stale_state["checkpoint"]})
    before = late.read_text()
    rolled = cli.fails("ledger", "witness", "--state", str(late), **env)
    assert "rollback" in rolled.stderr and late.read_text() == before
