"""Issue 32 item 5 through a real gateway: with a composite (Ed25519 + ML-DSA-44) signing key
active, generation receipts and detection reports carry both signatures, and `hallmark
receipt verify` / `report verify`, in a fresh process with only the key set and the pinned log
key, accept them and refuse one whose ML-DSA-44 signature was stripped. `signing-keys create
--alg` makes the key, as an operator would."""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from keys.db import open_store
from service.app import create_app
from service.settings import ServiceSettings
from tests.keys.conftest import Cli
from tests.service import gateway as gw
from tests.service.test_tamper_matrix import _generate
from tests.service.test_witness_cli import _fresh_cli


@pytest.fixture
def cli(monkeypatch, capsys):
    return Cli(monkeypatch, capsys)


def test_a_gateway_with_a_composite_key_issues_receipts_receipt_verify_accepts(tmp_path, cli, monkeypatch):
    settings, tokens = gw.provision(tmp_path)
    monkeypatch.setenv("HALLMARK_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("HALLMARK_KEK_FILE", str(settings.kek_file))
    assert "--alg must be one of" in cli.fails("signing-keys", "create", "--alg", "rsa").stderr
    created = cli.ok("signing-keys", "create", "--alg", "ed25519+ml-dsa-44", "--json").json()
    assert created["alg"] == "Ed25519+ML-DSA-44" and created["logged"]
    assert "Ed25519+ML-DSA-44" in cli.ok("signing-keys", "list").stdout
    app = create_app(ServiceSettings(model=gw.TEST_MODEL, draft_model=gw.TEST_DRAFT, device="cpu", max_batch=8),
                     store_settings=settings)
    url, server, thread = gw.serve(app)
    try:
        out = _generate(url, tokens["acme"], "The function returns", 5)
        detected = httpx.post(url + "/v1/detect", json={"text": out["text"]}, timeout=300,
                              headers={"Authorization": f"Bearer {tokens['acme']}"}).json()
        keyset = httpx.get(url + "/.well-known/hallmark-keys.json", timeout=30).json()
    finally:
        server.should_exit = True
        thread.join(60)
    assert [k["alg"] for k in keyset["keys"]] == ["Ed25519+ML-DSA-44"]
    for document in (out["receipt"], detected["report"]):
        assert document["signature"]["alg"] == "Ed25519+ML-DSA-44" and document["signature"]["kid"] == created["kid"]
        assert document["signature"]["ml_dsa_44_sig"]
    stripped = copy.deepcopy(out)
    del stripped["receipt"]["signature"]["ml_dsa_44_sig"]
    for name, body in (("out", out), ("detect", detected), ("stripped", stripped)):
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    (tmp_path / "out.txt").write_text(out["text"])
    (tmp_path / "keys.json").write_text(json.dumps(keyset))
    (tmp_path / "log.vkey").write_text(keyset["log"]["vkey"] + "\n")
    base = ["--keys", str(tmp_path / "keys.json"), "--trust-log-key", str(tmp_path / "log.vkey")]
    ok = _fresh_cli("receipt", "verify", str(tmp_path / "out.json"), "--text", str(tmp_path / "out.txt"), *base,
                    cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "Ed25519 and ML-DSA-44 signatures both verified" in ok.stdout and "the text matches" in ok.stdout
    report = _fresh_cli("report", "verify", str(tmp_path / "detect.json"), *base, cwd=tmp_path)
    assert report.returncode == 0 and "Ed25519 and ML-DSA-44 signatures both verified" in report.stdout, report.stderr
    refused = _fresh_cli("receipt", "verify", str(tmp_path / "stripped.json"), *base, cwd=tmp_path)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("error: receipt rejected: bad signature") and "ml_dsa_44_sig" in refused.stderr
