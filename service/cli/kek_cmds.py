"""``hallmark kek``: the key-encryption key (rotate, generate)."""

from __future__ import annotations

from pathlib import Path

import typer

from service.cli.app import JSON_OPTION, emit, kek_app, one_line_errors
from service.cli.store import cli_store


@kek_app.command("rotate")
@one_line_errors()
def kek_rotate(new_kek_file: Path = typer.Option(..., "--new-kek-file", help="File with the new base64 KEK."),
               as_json: bool = JSON_OPTION) -> None:
    """Re-wrap every key under a new KEK in one transaction (the current KEK comes from the
    environment). Afterwards point HALLMARK_KEK_FILE at the new file."""
    from keys.audit import default_actor
    from keys.kek import read_kek_file
    from keys.kek_rotation import rotate_kek
    from ledger.sealed import KEK_DEPENDANTS
    from service.cli.progress import note

    new = read_kek_file(new_kek_file)
    note("re-wrapping every key under the new KEK in one transaction...", as_json=as_json)
    with cli_store(require_kek=True) as store, store.transaction() as session:
        result = rotate_kek(session, current=store.keyring, new=new, actor=default_actor(),
                            dependants=KEK_DEPENDANTS)
    emit({"previous_kek_ids": list(result.previous_kek_ids), "new_kek_id": result.new_kek_id,
          "rewrapped_keys": result.rewrapped}, as_json,
         f"re-wrapped {result.rewrapped} key(s) under KEK {result.new_kek_id}; set "
         f"HALLMARK_KEK_FILE={new_kek_file} now (the previous KEK opens nothing any more)")


@kek_app.command("generate")
@one_line_errors()
def kek_generate(out: Path = typer.Option(..., "--out", help="New file to write (mode 0600; never overwritten)."),
                 as_json: bool = JSON_OPTION) -> None:
    """Write a new random KEK file."""
    from keys.kek import generate_kek_file

    kek = generate_kek_file(out)
    emit({"path": str(out), "kek_id": kek.id}, as_json, f"wrote a new KEK (id {kek.id}) to {out}")
