"""``hallmark doctor``: check what serving needs and say what to fix.

Checks, in order: the database is reachable, its schema is at the revision this Hallmark
needs, a KEK is configured and opens the stored keys and the transparency log's key, the
model assets are present, and
(engine ``vllm``) vLLM is importable or its server answers. Each check prints one line;
a failed one says what to do. Exit 1 if any check failed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import typer

from service.cli.app import JSON_OPTION, app, emit


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None


def _database(settings) -> tuple[list[Check], object | None]:
    from keys import migrate
    from keys.db import display_url, open_store
    from keys.errors import KeyStoreError

    from service.cli.store import missing_store

    missing = missing_store(settings)
    if missing is not None:
        return [Check("database", False, *missing)], None
    try:
        store = open_store(settings, check_schema=False)
        shown = display_url(store.url)
        with store.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except KeyStoreError as exc:
        return [Check("database", False, exc.user_message, "run `hallmark db upgrade` (or `make run`) to create the "
                      "default sqlite:///./var/hallmark.db, or set HALLMARK_DATABASE_URL")], None
    except Exception as exc:  # a driver error names no secret; its class is enough
        return [Check("database", False, f"cannot connect: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                      "start the database server or fix HALLMARK_DATABASE_URL")], None
    checks = [Check("database", True, f"{shown} is reachable")]
    try:
        current, head = migrate.current_revision(store.engine), migrate.head_revision()
    except Exception as exc:
        checks.append(Check("migrations", False, f"cannot read the schema revision: {type(exc).__name__}",
                            "run `hallmark db upgrade`"))
        return checks, store
    if current == head:
        checks.append(Check("migrations", True, f"schema at {head} (current)"))
    else:
        checks.append(Check("migrations", False, f"schema at {current or '(empty)'}, this Hallmark needs {head}",
                            "run `hallmark db upgrade`"))
    return checks, store


def _kek(settings, store) -> Check:
    from sqlalchemy import select

    from keys.errors import KeyStoreError
    from keys.kek import load_keyring
    from keys.models import KeyRow

    try:
        keyring = load_keyring(settings)
    except KeyStoreError as exc:
        return Check("kek", False, exc.user_message, "point HALLMARK_KEK_FILE at the KEK file the server uses")
    source = keyring.primary.source
    if store is None:
        return Check("kek", True, f"KEK {keyring.primary.id} from {source} (keys not checked: no database)")
    try:
        with store.sessions() as session:
            in_use = set(session.scalars(select(KeyRow.kek_id).distinct()))
    except Exception:
        return Check("kek", True, f"KEK {keyring.primary.id} from {source} (keys not checked: no schema yet)")
    unopened = sorted(in_use - set(keyring.ids))
    if unopened:
        return Check("kek", False, f"KEK {keyring.primary.id} from {source} does not open the stored keys "
                     f"(they are wrapped under KEK {', '.join(unopened)})",
                     "set HALLMARK_KEK_FILE to the KEK those keys were created with")
    return Check("kek", True, f"KEK {keyring.primary.id} from {source} opens the stored keys ({len(in_use)} KEK id(s) in use)")


def _model_dir(name: str, role: str) -> Check:
    from service.model_paths import BUNDLED_MODELS, resolve_model_path

    path = Path(resolve_model_path(name))
    shown = BUNDLED_MODELS.get(name, name)
    if not path.exists():
        if name in BUNDLED_MODELS:
            return Check(role, False, f"bundled model {shown} missing at {path}",
                         "reinstall Hallmark (the assets ship in the package: `make install`)")
        return Check(role, True, f"{name} is not a local directory: it is loaded from the Hugging Face cache")
    missing = [f for f in ("config.json", "tokenizer.json") if not (path / f).exists()]
    weights = list(path.glob("*.safetensors")) or list(path.glob("*.bin"))
    if missing or not weights:
        return Check(role, False, f"{shown} at {path} lacks {', '.join(missing + ([] if weights else ['weights']))}",
                     "point HALLMARK_MODEL at a complete Hugging Face checkpoint directory")
    size = sum(f.stat().st_size for f in weights) / 1e6
    return Check(role, True, f"{shown} at {path} ({size:.1f} MB of weights)")


def _engine(service) -> list[Check]:
    if service.engine == "local":
        checks = [_model_dir(service.model, "model")]
        if service.draft_model:
            checks.append(_model_dir(service.draft_model, "draft model"))
        checks.append(Check("vllm", True, "not used (engine local)"))
        return checks
    if service.vllm_url:
        import httpx

        url = service.vllm_url.rstrip("/") + "/v1/models"
        try:
            response = httpx.get(url, timeout=3.0)
        except httpx.HTTPError as exc:
            return [Check("vllm", False, f"{url} unreachable: {type(exc).__name__}",
                          "start `vllm serve` there or fix HALLMARK_VLLM_URL")]
        if response.status_code == 401:
            return [Check("vllm", True, f"{url} answers (401: set HALLMARK_VLLM_API_KEY)")]
        return [Check("vllm", response.status_code == 200, f"{url} answered {response.status_code}",
                      None if response.status_code == 200 else "check the vLLM server's logs")]
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return [Check("vllm", False, "engine vllm in-process, but vLLM is not installed",
                      "install the vllm extra (`pip install -e '.[vllm]'`) or set HALLMARK_VLLM_URL")]
    return [Check("vllm", True, "vLLM is installed (in-process engine)")]


def _log_key(settings, store) -> Check | None:
    """The transparency log's key opens under the configured KEK (None: nothing to check)."""
    from keys.errors import KeyStoreError
    from keys.kek import load_keyring
    from ledger.log.key import load_log_key

    if store is None:
        return None
    try:
        keyring = load_keyring(settings)
        with store.sessions() as session:
            authority = load_log_key(session, keyring)
    except KeyStoreError as exc:
        return Check("log key", False, exc.user_message,
                     "set HALLMARK_KEK_FILE to the KEK the log key was sealed under (`hallmark ledger checkpoint` "
                     "names the log's origin)")
    except Exception:  # no schema yet: the migrations check says what to do
        return None
    if authority is None:
        return Check("log key", True, "no transparency-log key yet: the gateway creates one at its first start "
                     "(or run `hallmark ledger init` as the database owner)")
    return Check("log key", True, f"the transparency log {authority.origin} opens under the KEK")


def run_checks() -> list[Check]:
    from pydantic import ValidationError

    from keys.settings import StoreSettings
    from service.settings import ServiceSettings
    from watermark.validation import first_error

    try:
        store_settings = StoreSettings()
        service = ServiceSettings()
    except ValidationError as exc:
        where, message = first_error(exc)
        message = message.removeprefix("Value error, ")
        if not where or where == "settings":  # a rule across settings (a model validator), as `serve` says it
            return [Check("settings", False, f"invalid settings: {message}",
                          "change the settings it names (each is the variable HALLMARK_<NAME>)")]
        name = "HALLMARK_" + where.replace(".", "_").upper()
        return [Check("settings", False, f"{name}: {message}", f"fix {name}")]
    checks, store = _database(store_settings)
    try:
        checks.append(_kek(store_settings, store))
        if checks[-1].ok:
            log_key = _log_key(store_settings, store)
            if log_key is not None:
                checks.append(log_key)
    finally:
        if store is not None:
            store.close()
    checks.extend(_engine(service))
    return checks


@app.command("doctor")
def doctor_command(as_json: bool = JSON_OPTION) -> None:
    """Check the database, migrations, KEK, the log key, model assets and vLLM, and say what to fix."""
    checks = run_checks()
    lines = []
    for c in checks:
        lines.append(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<12} {c.detail}")
        if c.fix:
            lines.append(f"      {'':<12} fix: {c.fix}")
    failed = [c for c in checks if not c.ok]
    lines.append("all checks passed" if not failed else f"{len(failed)} check(s) failed")
    emit({"ok": not failed, "checks": [asdict(c) for c in checks]}, as_json, "\n".join(lines))
    if failed:
        raise typer.Exit(1)
