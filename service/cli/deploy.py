"""``hallmark deploy``: vLLM deployment profiles and the key files vLLM servers read.

* ``deploy check PROFILE`` validates a profile offline against vLLM's own parser and
  configs and prints the exact launch command of every node (``deploy list`` names them).
* ``deploy engine-key`` derives a speculative deployment's engine key from a tenant's
  active key, records it in the store and writes vLLM's ``--config`` file (mode 0600).
* ``deploy keyring`` writes the per-request plugin's keyring file (mode 0600) for a remote
  ``vllm serve``.

Secrets go only into those files: the output names the file, key ids and fingerprints.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from service.cli.app import JSON_OPTION, CliError, deploy_app, emit, one_line_errors
from service.cli.store import cli_store

# ProfileError and KeyringError are ValueErrors whose messages never hold secrets.
_errors = one_line_errors(ValueError)


def vllm_logs_to_stderr() -> None:
    """vLLM logs to stdout by default, which would corrupt ``--json`` output."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@deploy_app.command("list")
@_errors
def deploy_list(as_json: bool = JSON_OPTION) -> None:
    """List the deployment profiles in deploy/."""
    from service.engines.vllm.profiles import PROFILE_DIR, load_profile

    profiles = [load_profile(str(path)) for path in sorted(PROFILE_DIR.glob("*.yaml"))]
    rows = [{"name": p.name, "model": p.model, "watermark": p.watermark, "nodes": p.hardware.nodes,
             "gpus_per_node": p.hardware.gpus_per_node, "gpu": p.hardware.gpu} for p in profiles]
    emit(rows, as_json, "\n".join(f"{r['name']}: {r['model']} on {r['nodes']} x {r['gpus_per_node']} "
                                  f"{r['gpu']}, watermark {r['watermark']}" for r in rows) or "(none)")


@deploy_app.command("check")
@_errors
def deploy_check(
    profile: str = typer.Argument(..., help="A profile name in deploy/ or a YAML file."),
    engine_key_file: Optional[Path] = typer.Option(
        None, "--engine-key-file", help="Validate with this engine-key --config file (else a placeholder key)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Validate a profile against vLLM's own argument parser and configs, offline."""
    vllm_logs_to_stderr()
    from service.engines.vllm.profile_check import check_profile
    from service.engines.vllm.profiles import load_profile

    loaded = load_profile(profile)
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise CliError("deploy check needs vLLM's argument parser: install the vllm extra "
                       "(pip install 'hallmark[vllm]')") from None
    result = check_profile(loaded, engine_key_file=engine_key_file)
    if as_json:
        emit(result.to_dict(), True)
    else:
        lines = [f"profile {result.profile}: {'ok' if result.ok else 'REJECTED'}"]
        lines += [f"  checked {line}" for line in result.checks]
        lines += [f"  problem: {line}" for line in result.problems]
        lines += ["launch command(s):"] + [f"  {command}" for command in result.commands]
        emit(None, False, "\n".join(lines))
    if not result.ok:
        raise CliError(f"profile {result.profile} is rejected: {result.problems[0]}")


@deploy_app.command("engine-key")
@_errors
def deploy_engine_key(
    tenant: str = typer.Option(..., "--tenant", help="Tenant whose active key the engine key derives from."),
    deployment: str = typer.Option(..., "--deployment", help="Deployment name (e.g. the profile name)."),
    out: Path = typer.Option(..., "--out", help="The vLLM --config YAML file to write (mode 0600)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Derive a speculative deployment's engine key, record it, and write vLLM's --config file."""
    from keys.audit import default_actor
    from service.engines.vllm.engine_key import provision_engine_key, write_engine_config

    with cli_store(require_kek=True) as store, store.transaction() as session:
        provisioned = provision_engine_key(session, store.keyring, tenant=tenant, deployment=deployment,
                                           actor=default_actor())
        # Written inside the transaction: if the file cannot be written, nothing is recorded.
        path = write_engine_config(out, provisioned.key)
    info = provisioned.info
    payload = {"tenant": info.tenant, "deployment": deployment, "key_id": info.key_id, "version": info.version,
               "state": info.state, "fingerprint": info.fingerprint, "algorithm": info.spec.algorithm,
               "created": provisioned.created, "config_file": str(path),
               "launch": f"vllm serve MODEL ... --config {path}"}
    emit(payload, as_json,
         f"{'recorded' if provisioned.created else 'found'} engine key {info.key_id} (tenant {info.tenant}, "
         f"version {info.version}, fingerprint {info.fingerprint}); wrote {path} (mode 600): pass it with "
         f"`vllm serve ... --config {path}`")


@deploy_app.command("keyring")
@_errors
def deploy_keyring(
    out: Path = typer.Option(..., "--out", help="The keyring file to write (mode 0600)."),
    tenant: Optional[list[str]] = typer.Option(None, "--tenant", metavar="NAME", help="Only these tenants (repeatable)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write the per-request plugin's keyring for a remote vllm serve (active and verify-only keys)."""
    from keys.audit import default_actor, record_audit
    from keys.material import detection_keys
    from keys.models import REVOKED
    from service.engines.vllm.keyring import KeyringEntry, write_keyring

    entries: list[KeyringEntry] = []
    with cli_store(require_kek=True) as store, store.transaction() as session:
        stored = []
        for name in tenant or [None]:
            stored += detection_keys(session, store.keyring, tenant=name)
        # Revoked keys stay out; verify-only keys are listed with their state, so that the
        # plugin refuses them by name (it generates with active keys only).
        usable = [key for key in stored if key.state != REVOKED]
        for key in usable:
            entries.append(KeyringEntry(key_id=key.key_id, tenant=key.tenant, version=key.version,
                                        fingerprint=key.fingerprint, key=key.material, state=key.state))
            record_audit(session, actor=default_actor(), action="key.exported_to_vllm_keyring",
                         tenant_id=key.tenant_id, key_id=key.key_id,
                         details={"version": key.version, "fingerprint": key.fingerprint, "file": str(out)})
        path = write_keyring(out, entries)
    keys = [{"tenant": e.tenant, "key_id": e.key_id, "version": e.version, "fingerprint": e.fingerprint}
            for e in entries]
    emit({"keyring_file": str(path), "keys": keys}, as_json,
         f"wrote {len(keys)} key(s) to {path} (mode 600); start vllm serve with HALLMARK_VLLM_KEYRING={path}")
