"""``hallmark keys``: create, import, rotate, list, show, revoke and export watermark keys.

Each command parses its options, opens the store (:mod:`service.cli.store`), calls one
domain function of :mod:`keys` inside one transaction, and prints the result (``--json``:
one JSON document). A domain error becomes ``error: <one line>`` and a non-zero exit, and
the transaction is rolled back, so a failed command changes nothing. Only
``keys export --yes`` prints a secret.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from service.cli.app import JSON_OPTION, CliError, emit, keys_app, one_line_errors
from service.cli.choices import Algorithm, CoinKind, DedupScope, Mode
from service.cli.store import cli_store
from service.cli.tables import plain, table

if TYPE_CHECKING:
    from keys.lifecycle import KeyRecord
    from watermark.spec import WatermarkSpec


def _spec_changes(algorithm: str | None, context_width: int | None, alpha: float | None,
                  dedup: str | None, dedup_max_history: str | None, coin: str | None,
                  mode: str | None = None, prf: str | None = None) -> dict[str, Any]:
    """The spec fields given on the command line (absent options are left out)."""
    changes: dict[str, Any] = {}
    for name, value in (("algorithm", algorithm), ("context_width", context_width), ("alpha", alpha),
                        ("dedup", dedup), ("coin", coin), ("mode", mode), ("prf", prf)):
        if value is not None:
            changes[name] = value
    if dedup_max_history is not None:
        if dedup_max_history.strip().lower() in ("all", "none", "unlimited"):
            changes["dedup_max_history"] = None
        else:
            try:
                changes["dedup_max_history"] = int(dedup_max_history)
            except ValueError:
                raise CliError("--dedup-max-history takes a positive integer or 'all'") from None
    return changes


def _option_names(changes: dict[str, Any]) -> str:
    return ", ".join("--" + name.replace("_", "-") for name in changes)


def _spec_text(spec: "WatermarkSpec") -> str:
    history = "all positions" if spec.dedup_max_history is None else f"{spec.dedup_max_history} positions"
    text = f"{spec.algorithm}, context width {spec.context_width}, dedup {spec.dedup} ({history})"
    if spec.algorithm == "dual_key_gumbel":
        text += f", alpha {spec.alpha}, coin {spec.coin}"
    diversity = f" ({spec.diversity})" if spec.mode == "diverse" else ""
    return text + f", mode {spec.mode}{diversity}, prf {spec.prf} ({spec.key_bits}-bit key)"


def _prf_note(spec: "WatermarkSpec") -> str:
    """Why this key size: what a key search costs, and what the PRF gives up (docs:
    concepts/threat-model.md, the brute-force arithmetic)."""
    from watermark import prf

    if spec.prf == prf.PHILOX_V1:
        return ("key: 64-bit (philox4x32-10-v1, vLLM's default): bit-compatible with vLLM, but text or per-token "
                "scores let anyone test guesses offline, and 2**64 guesses take about 2 H100-years (18 hours on "
                "1,000 H100s). Unless the key must run in vLLM, use --prf hmac-sha256-philox-v1 (256-bit).")
    if spec.prf == prf.HMAC_SHA256_V1:
        return ("key: 256-bit (hmac-sha256-v1, vLLM's hmac_sha256): a key search needs 2**256 guesses; sampling "
                "costs one HMAC per vocabulary entry, so use it only for keys shared with a vLLM deployment.")
    return ("key: 256-bit (hmac-sha256-philox-v1, the default): a key search needs 2**256 guesses, and sampling "
            "runs at Philox's speed. vLLM cannot generate with it: for a key that must run in vLLM, "
            "--prf philox (64-bit) or hmac_sha256.")


def _key_line(info: "KeyRecord") -> str:
    return (f"key {info.key_id}: tenant {info.tenant}, version {info.version}, {info.state}, "
            f"fingerprint {info.fingerprint}, {info.spec.algorithm} w={info.spec.context_width}")


def _key_rows(keys: "list[KeyRecord]") -> str:
    # MODE: `diverse` salts each generation, `deterministic` is vLLM's bit-compatible scheme
    # (watermark.spec.Mode); a key's mode decides what regenerating a prompt gives.
    return table([[k.key_id, k.tenant, k.version, k.state, k.fingerprint, k.spec.algorithm, k.spec.mode,
                   k.spec.context_width, "yes" if k.imported else "no", k.created_at.isoformat(timespec="seconds")]
                  for k in keys],
                 ["KEY_ID", "TENANT", "VERSION", "STATE", "FINGERPRINT", "ALGORITHM", "MODE", "WIDTH",
                  "IMPORTED", "CREATED"])


# Spec options shared by create, import and rotate.
ALGORITHM = typer.Option(None, "--algorithm", help="gumbel (one key) or dual_key_gumbel (keys A and B; what a "
                         "speculating engine needs: with a gumbel key the local engine does not speculate).")
CONTEXT_WIDTH = typer.Option(None, "--context-width", help="Previous generated tokens seeding each token (1-16).")
ALPHA = typer.Option(None, "--alpha", help="dual_key_gumbel: share of key-B tokens without speculation (0-1).")
DEDUP = typer.Option(None, "--dedup", help="Which repeated contexts are sampled unwatermarked: none, single_turn "
                     "(within one generation) or all.")
DEDUP_MAX_HISTORY = typer.Option(None, "--dedup-max-history", metavar="N|all",
                                 help="Positions searched for a repeated context (a positive integer), or 'all'.")
COIN = typer.Option(None, "--coin", help="dual_key_gumbel's speculative acceptance coin: ordinary (vLLM's) or "
                    "keyed (lets the detector weigh each token's key).")
PRF = typer.Option(None, "--prf", help="hmac-sha256-philox-v1 (a new key's default: 256-bit key, Philox's speed), "
                   "philox (64-bit, vLLM's default) or hmac_sha256 (256-bit, vLLM's; slow to sample).")
MODE = typer.Option(None, "--mode", help="diverse (a new key's default: its first context-width tokens are "
                    "sampled unwatermarked from the request's random stream, so regenerating gives a new text; "
                    "with a --dedup other than all, each generation draws one of 16 salts instead) or "
                    "deterministic (vLLM's scheme bit for bit: one prompt, one text; imported keys' default).")


@keys_app.command("create")
@one_line_errors()
def keys_create(tenant: str = typer.Option(..., "--tenant", help="Tenant name."),
                algorithm: Optional[Algorithm] = ALGORITHM, context_width: Optional[int] = CONTEXT_WIDTH,
                alpha: Optional[float] = ALPHA, dedup: Optional[DedupScope] = DEDUP,
                dedup_max_history: Optional[str] = DEDUP_MAX_HISTORY, coin: Optional[CoinKind] = COIN,
                mode: Optional[Mode] = MODE, prf: Optional[str] = PRF,
                as_json: bool = JSON_OPTION) -> None:
    """Create a random key: active if the tenant has none, else verify-only. It keeps the
    tenant's current spec (its active key's, else its newest key's) except what the options
    change; a tenant's first key gets the defaults (gumbel, context width 4)."""
    from keys.audit import default_actor
    from keys.lifecycle import create_key, spec_for_new_key

    changes = _spec_changes(algorithm, context_width, alpha, dedup, dedup_max_history, coin, mode, prf)
    with cli_store(require_kek=True) as store, store.transaction() as session:
        spec, source = spec_for_new_key(session, tenant=tenant, changes=changes)
        info = create_key(session, store.keyring, tenant=tenant, spec=spec, actor=default_actor())
    if source is None:
        origin = "the defaults" + (f" with {_option_names(changes)} given" if changes else "") + \
                 " (the tenant's first key)"
    else:
        origin = (f"the spec of key {source.key_id} (version {source.version}, {source.state})"
                  + (f" with {_option_names(changes)} changed" if changes else ", unchanged"))
    note = "" if info.state == "active" else "; the tenant already has an active key: use `keys rotate` to replace it"
    payload = {**info.to_dict(), "spec_source": None if source is None else
               {"key_id": source.key_id, "version": source.version, "state": source.state}}
    emit(payload, as_json, f"created {_key_line(info)}\nspec: {_spec_text(info.spec)}; from {origin}{note}\n"
                           f"{_prf_note(info.spec)}")


@keys_app.command("import")
@one_line_errors()
def keys_import(tenant: str = typer.Option(..., "--tenant", help="Tenant name."),
                secret_file: Optional[Path] = typer.Option(
                    None, "--secret-file", help="File holding the key (decimal or 0x hex; 64-bit for philox, 256 for --prf hmac_sha256)."),
                vllm_config: Optional[Path] = typer.Option(
                    None, "--vllm-config", help="JSON/YAML file with vLLM's --watermark-config (key included)."),
                algorithm: Optional[Algorithm] = ALGORITHM, context_width: Optional[int] = CONTEXT_WIDTH,
                alpha: Optional[float] = ALPHA, dedup: Optional[DedupScope] = DEDUP,
                dedup_max_history: Optional[str] = DEDUP_MAX_HISTORY, coin: Optional[CoinKind] = COIN,
                mode: Optional[Mode] = MODE, prf: Optional[str] = PRF,
                source: Optional[str] = typer.Option(None, "--source", help="Where the key comes from (recorded)."),
                as_json: bool = JSON_OPTION) -> None:
    """Import an existing deployment's key (for example vLLM's) so its text is detected."""
    from keys.audit import default_actor
    from keys.importing import read_secret_file, read_vllm_config
    from keys.lifecycle import build_spec, import_key

    changes = _spec_changes(algorithm, context_width, alpha, dedup, dedup_max_history, coin, mode, prf)
    if (secret_file is None) == (vllm_config is None):
        raise CliError("give exactly one of --secret-file F (with --algorithm and --context-width) "
                       "or --vllm-config F")
    if vllm_config is not None:
        if changes:
            raise CliError("--vllm-config carries the spec; leave out --algorithm, --context-width "
                           "and the other spec options")
        secret, spec = read_vllm_config(vllm_config)
        source = source or f"vllm-config:{vllm_config.name}"
    else:
        if algorithm is None or context_width is None:
            raise CliError("--secret-file needs --algorithm and --context-width, exactly as the "
                           "deployment used them (a wrong spec detects nothing)")
        # Another deployment's key: deterministic with vLLM's default PRF (its scheme) unless
        # --mode / --prf say otherwise.
        spec = build_spec(**{"mode": "deterministic", "prf": "philox", **changes})
        secret = read_secret_file(secret_file)
    with cli_store(require_kek=True) as store, store.transaction() as session:
        info = import_key(session, store.keyring, tenant=tenant, secret=secret, spec=spec,
                          source=source, actor=default_actor())
    emit(info.to_dict(), as_json, f"imported {_key_line(info)}")


@keys_app.command("rotate")
@one_line_errors()
def keys_rotate(tenant: str = typer.Option(..., "--tenant", help="Tenant name."),
                algorithm: Optional[Algorithm] = ALGORITHM, context_width: Optional[int] = CONTEXT_WIDTH,
                alpha: Optional[float] = ALPHA, dedup: Optional[DedupScope] = DEDUP,
                dedup_max_history: Optional[str] = DEDUP_MAX_HISTORY, coin: Optional[CoinKind] = COIN,
                mode: Optional[Mode] = MODE, prf: Optional[str] = PRF,
                as_json: bool = JSON_OPTION) -> None:
    """New active key (same spec unless options change it); the old one becomes verify-only."""
    from keys.audit import default_actor
    from keys.lifecycle import rotate_key

    changes = _spec_changes(algorithm, context_width, alpha, dedup, dedup_max_history, coin, mode, prf)
    with cli_store(require_kek=True) as store, store.transaction() as session:
        rotation = rotate_key(session, store.keyring, tenant=tenant, spec_changes=changes,
                              actor=default_actor())
    emit({"new": rotation.new.to_dict(), "previous": rotation.previous.to_dict()}, as_json,
         f"rotated tenant {tenant}: {rotation.new.key_id} (version {rotation.new.version}) is active, "
         f"{rotation.previous.key_id} (version {rotation.previous.version}) is verify-only")


@keys_app.command("list")
@one_line_errors()
def keys_list(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's keys."),
              as_json: bool = JSON_OPTION) -> None:
    """List keys (never their secrets)."""
    from keys.lifecycle import list_keys

    with cli_store() as store, store.transaction(write=False) as session:
        keys = list_keys(session, tenant=tenant)
    emit([k.to_dict() for k in keys], as_json, _key_rows(keys))


@keys_app.command("show")
@one_line_errors()
def keys_show(key_id: str = typer.Argument(..., help="Key id (see `keys list`)."),
              as_json: bool = JSON_OPTION) -> None:
    """Show one key's record (never its secret)."""
    from keys.lifecycle import get_key

    with cli_store() as store, store.transaction(write=False) as session:
        info = get_key(session, key_id=key_id)
    data = info.to_dict()
    emit(data, as_json, "\n".join(f"{name}: {plain(value)}" for name, value in data.items()))


@keys_app.command("revoke")
@one_line_errors()
def keys_revoke(key_id: str = typer.Argument(..., help="Key id."),
                reason: str = typer.Option(..., "--reason", help="Why (recorded and audited)."),
                as_json: bool = JSON_OPTION) -> None:
    """Revoke a compromised key: detections under it are reported as revoked."""
    from keys.audit import default_actor
    from keys.lifecycle import get_key, revoke_key

    with cli_store() as store, store.transaction() as session:
        previous_state = get_key(session, key_id=key_id).state
        info = revoke_key(session, key_id=key_id, reason=reason, actor=default_actor())
    note = ""
    if previous_state == "active":
        note = (f"; tenant {info.tenant} has no active key now, create one with "
                f"`hallmark keys create --tenant {info.tenant}`")
    emit(info.to_dict(), as_json, f"revoked {info.key_id} (tenant {info.tenant}, version {info.version}){note}")


@keys_app.command("export")
@one_line_errors()
def keys_export(key_id: str = typer.Argument(..., help="Key id."),
                yes: bool = typer.Option(False, "--yes", help="Confirm printing the secret."),
                as_json: bool = JSON_OPTION) -> None:
    """Print a key WITH its secret (audited). Anyone holding it can forge or strip watermarks."""
    from keys.audit import default_actor
    from keys.material import export_key

    if not yes:
        raise CliError("keys export prints the secret key; add --yes to confirm")
    with cli_store(require_kek=True) as store, store.transaction() as session:
        exported = export_key(session, store.keyring, key_id=key_id, actor=default_actor())
    vllm = exported.vllm_watermark_config()
    payload = {"key_id": exported.key_id, "tenant": exported.tenant, "version": exported.version,
               "state": exported.state, "fingerprint": exported.fingerprint,
               "spec": exported.spec.public_dict(), "secret": exported.secret,
               "secret_hex": f"0x{exported.secret:0{exported.spec.key_bits // 4}x}", "key_bits": exported.spec.key_bits,
               "vllm_watermark_config": vllm}
    text = "\n".join([
        f"key {exported.key_id} (tenant {exported.tenant}, version {exported.version}, {exported.state})",
        f"fingerprint: {exported.fingerprint}",
        f"secret: {exported.secret} (0x{exported.secret:0{exported.spec.key_bits // 4}x}; "
        f"{exported.spec.key_bits}-bit key, prf {exported.spec.prf})",
        f"vllm --watermark-config: {json.dumps(vllm) if vllm else '(not expressible: keyed coin, salted diverse mode or a PRF vLLM lacks)'}",
    ])
    emit(payload, as_json, text)
