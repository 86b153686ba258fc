"""`hallmark serve` (the gateway) and `hallmark quickstart` (what `make run` runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from service.cli.app import CliError, app
from service.cli.listen import display, listen

if TYPE_CHECKING:
    import socket

DEMO_TENANT = "demo"


def _serve(host: str, port: int, *, sockets: "list[socket.socket] | None" = None, workers: int = 1,
           **overrides) -> None:
    """Serve the gateway on ``sockets`` (bound by the caller), else on ``host:port``, which is
    bound here once the settings and the store check out and before the model loads.
    ``workers`` > 1: that many processes share the sockets (:mod:`service.cli.workers`)."""
    import uvicorn
    from pydantic import ValidationError

    from keys.errors import KeyStoreError
    from keys.settings import StoreSettings
    from service.app import create_app
    from service.settings import ServiceSettings
    from watermark.validation import first_error

    try:
        settings = ServiceSettings(**{k: v for k, v in overrides.items() if v is not None})
        store_settings = StoreSettings()
        from keys.db import open_store

        open_store(store_settings, require_kek=True).close()  # fail fast with one line
        from keys.kek import forget_kek_environment

        forget_kek_environment()  # the settings hold it now; no child process inherits it
    except KeyStoreError as exc:
        raise CliError(exc.user_message) from None
    except ValidationError as exc:  # one line naming the variable, as `hallmark doctor` does
        where, message = first_error(exc)
        message = message.removeprefix("Value error, ")
        if not where or where == "settings":  # a rule across settings (a model validator)
            raise CliError(f"invalid settings: {message}") from None
        raise CliError(f"invalid setting HALLMARK_{where.replace('.', '_').upper()}: {message}") from None
    except ValueError as exc:
        raise CliError(f"invalid setting: {exc}") from None
    if sockets is None:
        sockets = listen(host, port, how_to_pick=lambda free: (
            f"pick another port: `hallmark serve --port {free or 'N'}`"))
    import logging

    from service.cli.progress import note, quiet_libraries

    worker = 0
    if workers > 1:
        from service.cli.workers import fork_workers

        worker = fork_workers(workers)
        if worker is None:
            return  # the supervisor: every worker has exited
    from service.logs import logging_config
    from service.model_paths import BUNDLED_MODELS

    quiet_libraries()
    url = f"http://{display(host, port)}"
    note(f"loading the model ({BUNDLED_MODELS.get(settings.model, settings.model)}); the server answers on "
         f"{url} once it is loaded (the page: /ui, the API reference: /docs)")
    config = uvicorn.Config(create_app(settings, store_settings=store_settings), host=host, port=port,
                            log_config=logging_config(settings.log_format, settings.log_level),
                            log_level=settings.log_level, access_log=False,  # service.request_log logs requests
                            # The gateway decides whom to believe (service.access.addresses, --trusted-proxies):
                            # uvicorn would rewrite the client from X-Forwarded-For sent by 127.0.0.1.
                            proxy_headers=False)
    logging.captureWarnings(True)  # Python warnings in the same format as every other line

    class Gateway(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and worker == 0:  # uvicorn names no address for sockets it was given
                logger = logging.getLogger("hallmark.app")
                logger.info("ready: answering on %s (the page: %s/ui)%s", url, url,
                            f" with {workers} worker processes" if workers > 1 else "")
                if workers > 1 and settings.rate_limit_backend in ("auto", "memory") and not settings.redis_url \
                        and (settings.rate_limit_backend == "memory"
                             or not (store_settings.database_url or "").startswith("postgresql")):
                    logger.warning("rate limits are per worker process with the memory backend: a token may use "
                                   "%d times its budget (set HALLMARK_REDIS_URL, or HALLMARK_RATE_LIMIT_BACKEND="
                                   "database, to share them)", workers)

    server = Gateway(config)
    from service.access import group_commit

    # The requests this process has received and not answered (uvicorn's tasks, each created
    # once a request's headers arrived): expert requests' audit events wait for those in
    # flight and commit with theirs (service.access.group_commit.Held).
    group_commit.in_flight = lambda: len(server.server_state.tasks)
    server.run(sockets=sockets)


@app.command("serve")
def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port (1-65535)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="local (default) or vllm."),
    model: Optional[str] = typer.Option(None, "--model", help="Checkpoint directory or bundled model name."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft model ('' disables speculation)."),
    vllm_url: Optional[str] = typer.Option(None, "--vllm-url", help="Remote `vllm serve` URL (vllm engine)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu or cuda[:N]."),
    workers: int = typer.Option(1, "--workers", min=1, max=64,
                                help="Worker processes sharing the port (each loads the model; 1: this process)."),
    trusted_proxies: Optional[str] = typer.Option(
        None, "--trusted-proxies", help="Comma-separated proxies (addresses or networks) whose X-Forwarded-For is "
        "believed; none by default."),
) -> None:
    """Serve the HTTP gateway (settings from HALLMARK_* environment variables and these options)."""
    _serve(host, port, workers=workers, engine=engine, model=model, draft_model=draft_model, vllm_url=vllm_url,
           device=device, trusted_proxies=trusted_proxies)


def try_it_line(host: str, port: int, token: str | None) -> str:
    """The banner's line that README's "Try it" starts from: one ``export`` that names this
    server's URL (whatever the port) and, on first run, the token, so every later command
    reads ``$HALLMARK_URL`` and ``$TOKEN`` instead of a hard-coded port."""
    # A server listening on every interface is reached through loopback from this machine.
    client_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{display(client_host, port)}"
    if token:
        return f"README's \"Try it\", in another shell: `export HALLMARK_URL={url} TOKEN={token}`"
    return (f"README's \"Try it\", in another shell: `export HALLMARK_URL={url}`, "
            "and `export TOKEN=` the token you saved")


def _bootstrap_demo() -> str | None:
    """Migrate the database and, on first run, create the demo tenant, its key and a token.
    Returns the new raw token (printed once), or None when the tenant already existed."""
    from keys import migrate
    from keys.errors import UnknownTenant
    from keys.lifecycle import create_key
    from keys.tenants import create_tenant, get_tenant
    from keys.tokens import issue_token
    from service.cli.store import cli_store
    from watermark.spec import NEW_KEY_DIVERSITY, NEW_KEY_MODE, WatermarkSpec

    with cli_store(require_kek=True, check_schema=False, create=True) as store:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            try:
                get_tenant(session, name=DEMO_TENANT)
                return None
            except UnknownTenant:
                pass
            actor = "quickstart"
            create_tenant(session, name=DEMO_TENANT, actor=actor)
            # The bundled engine speculates, which needs a dual-key key.
            create_key(session, store.keyring, tenant=DEMO_TENANT, actor=actor,
                       spec=WatermarkSpec(algorithm="dual_key_gumbel", mode=NEW_KEY_MODE,
                                          diversity=NEW_KEY_DIVERSITY, dedup="all"))
            return issue_token(session, tenant=DEMO_TENANT, actor=actor).raw_token


@app.command("quickstart")
def quickstart_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535,
                             help="TCP port (1-65535; `make run` passes $PORT)."),
) -> None:
    """Development quick start: a SQLite store and KEK file under ./var, a `demo` tenant with
    an active key and an API token (printed once), then the gateway with the bundled models."""
    from keys.errors import KeyStoreError
    from keys.kek import ensure_dev_kek_file
    from keys.settings import DEV_KEK_FILE  # the one default the CLI and the server share (pydantic-settings: load late)
    from service.cli import invocation

    # The port first: a busy one fails before anything is created or printed.
    sockets = listen(host, port, how_to_pick=lambda free: (
        f"pick another port: `PORT={free or 'N'} make run` (or `hallmark quickstart --port {free or 'N'}`)"))
    if not os.environ.get("HALLMARK_KEK") and not os.environ.get("HALLMARK_KEK_FILE"):
        try:
            ensure_dev_kek_file(DEV_KEK_FILE)
        except KeyStoreError as exc:
            raise CliError(exc.user_message) from None
        os.environ["HALLMARK_KEK_FILE"] = str(DEV_KEK_FILE)
        typer.echo(f"development mode: the KEK lives in {DEV_KEK_FILE} (set HALLMARK_KEK_FILE in production)")
    Path("var").mkdir(exist_ok=True)
    try:
        token = _bootstrap_demo()
    except KeyStoreError as exc:
        raise CliError(exc.user_message) from None
    if token:
        from watermark.spec import NEW_KEY_MODE

        typer.echo(f"created tenant 'demo' with an active dual-key watermark key (mode {NEW_KEY_MODE}: "
                   "each regeneration of a prompt starts from its own random tokens).")
        typer.echo(f"API token for 'demo' (shown once, store it now): {token}")
    else:
        typer.echo(f"tenant 'demo' exists; use the token you saved (or "
                   f"`{invocation.command('tokens issue --tenant demo')}`).")
    url = f"http://{display(host, port)}"
    typer.echo(f"serving on {url} (local engine, model hallmark-tiny-dsv32) once the model is loaded: "
               f"the page is {url}/ui, the API reference {url}/docs")
    typer.echo(try_it_line(host, port, token))
    typer.echo(invocation.banner_line())
    _serve(host, port, sockets=sockets)
