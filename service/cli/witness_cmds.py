"""`hallmark witness`: a tlog-witness server (`serve`) and its key (`key`). The monitor of a
log (rollbacks, forks, split views by gossip) stays `hallmark ledger witness`."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import typer

from service.cli.app import JSON_OPTION, CliError, app, emit

witness_app = typer.Typer(no_args_is_help=True, help="A tlog-witness server: cosign other logs' checkpoints.")
app.add_typer(witness_app, name="witness")

_DIR = typer.Option(..., "--dir", help="The witness's directory: its key (witness.key) and state (witness.db).")


def load_or_create(directory: Path, name: str | None, algorithm: str):
    """The witness's cosigner from ``directory/witness.key`` (created, mode 0600, when absent)."""
    from ledger.log.cosignature import from_seed, generate, private_seed

    path = directory / "witness.key"
    if path.exists():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            found = from_seed(raw["name"], raw["algorithm"], base64.b64decode(raw["seed"]))
        except (OSError, ValueError, KeyError, TypeError):
            raise CliError(f"{path} is not a witness key; restore it from a backup") from None
        if name is not None and name != found.name:
            raise CliError(f"{path} is the key of witness {found.name!r}, not {name!r}")
        return found
    if name is None:
        raise CliError(f"{path} does not exist: give --name to create the witness")
    try:
        cosigner = generate(name, algorithm)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    directory.mkdir(parents=True, exist_ok=True)
    alg, seed = private_seed(cosigner)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"name": name, "algorithm": alg, "seed": base64.b64encode(seed).decode()}, out)
    return cosigner


@witness_app.command("key")
def witness_key(directory: Path = _DIR,
                name: str = typer.Option(None, "--name", help="The witness's name (a schema-less URL), to create it."),
                algorithm: str = typer.Option("ml-dsa-44", "--alg", help="ml-dsa-44 (tlog-cosignature v1.1.0-rc.1) or ed25519 (v1.0.1)."),
                as_json: bool = JSON_OPTION) -> None:
    """Print the witness's public key (a vkey for a tlog-policy `witness` line), creating it."""
    key = load_or_create(directory, name, algorithm).key
    emit({"name": key.name, "algorithm": key.algorithm, "vkey": key.vkey}, as_json, key.vkey)


@witness_app.command("serve")
def witness_serve(directory: Path = _DIR,
                  name: str = typer.Option(None, "--name", help="The witness's name (a schema-less URL), to create it."),
                  algorithm: str = typer.Option("ml-dsa-44", "--alg", help="ml-dsa-44 or ed25519, to create it."),
                  log: list[str] = typer.Option([], "--log", help="A log's vkey to witness (its name is its origin); remembered. Repeatable."),
                  host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
                  port: int = typer.Option(8010, "--port", help="Port to listen on.")) -> None:
    """Serve tlog-witness v1.0.0 (POST /add-checkpoint, GET /<origin hash>/checkpoint)."""
    import uvicorn

    from ledger.log.cosigning_witness import CosigningWitness
    from ledger.log.note import NoteError
    from service.witness_app import create_witness_app

    cosigner = load_or_create(directory, name, algorithm)
    witness = CosigningWitness(directory / "witness.db", cosigner)
    for vkey in log:
        try:
            witness.add_log(vkey)
        except NoteError as exc:
            raise CliError(f"--log: {exc}") from None
    if not witness.logs():
        raise CliError("this witness knows no log: give --log <log vkey> (`hallmark ledger checkpoint --json` prints it)")
    typer.echo(f"witness {cosigner.key.vkey}", err=True)
    typer.echo(f"witnessing {', '.join(k.name for k in witness.logs())} on http://{host}:{port}", err=True)
    uvicorn.run(create_witness_app(witness), host=host, port=port, log_level="warning", access_log=False)
