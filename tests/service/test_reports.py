"""Signed detection reports from a running gateway say what they checked: the text's and
token ids' hashes, the detector's id (version and configuration hash), the time, whose keys
and how many, the threshold and settings, and a verdict that names its threshold. The two
cases that misled before: one text signed "watermarked" for acme and "not_watermarked" for
globex, both valid; and a "watermarked, key acme" signed for human text at threshold
0.999999."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from ledger.chain import canonical_json, hash_token_ids
from ledger.receipts import public_keys
from ledger.reports import config_sha256, verify_report
from service.provenance import REPORT_OMITS, report_statement
from tests.service import gateway as gw

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HUMAN = ("The committee met on Tuesday to review the budget. After a long discussion about the new "
         "library's opening hours, the parking situation near the station and the cost of repairing the "
         "roof, they agreed to postpone the decision until the next quarter, when more data would be "
         "available to everyone involved. Several members asked for a written summary before then.")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("reports"), secrets=gw.FIXED_SECRETS, max_tokens_cap=256,
                       probe_family_per_day=1_000)  # one text (as text and as token ids) checked many times
    yield gateway
    gateway.stop()


def _client(server, who="acme") -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens[who]}"}, timeout=300)


def _keys(server):
    return public_keys(httpx.get(server.url + "/.well-known/hallmark-keys.json", timeout=30).json())


@pytest.fixture(scope="module")
def generated(server):
    out = _client(server).post("/v1/generate", json={"prompt": "The function returns", "max_tokens": 120,
                                                     "temperature": 1.0, "seed": 5}).json()
    assert out["watermark"]["key_id"]
    return out


def test_one_text_gets_reports_that_each_say_whose_keys_were_tested(server, generated):
    text = generated["text"]
    checks = {}
    for who in ("acme", "globex", "admin"):
        response = _client(server, who).post("/v1/detect", json={"text": text})
        assert response.status_code == 200, response.text
        checks[who] = verify_report(response.json()["report"], _keys(server), text=text).statement
    acme, globex, admin = checks["acme"], checks["globex"], checks["admin"]
    assert acme["verdict"] == "watermarked" and acme["basis"][0] == "watermark"
    assert acme["scope"] == {"keys_of": "tenant", "tenant": "acme", "tenants": 1, "keys": 1}
    assert acme["verdict_text"].startswith("watermarked: passes the threshold 1e-06 under one of the 1 key of tenant acme")
    # globex's report is not the opposite claim: it says that globex's key is not in the text.
    assert globex["verdict"] == "not_watermarked" and "watermark" not in globex["basis"]
    assert globex["scope"] == {"keys_of": "tenant", "tenant": "globex", "tenants": 1, "keys": 1}
    assert globex["verdict_text"].startswith(
        "not watermarked at threshold 1e-06: no evidence of the watermark of the 1 key of tenant globex")
    assert admin["verdict"] == "watermarked" and admin["scope"]["keys_of"] == "all_tenants"
    assert admin["scope"]["tenant"] is None and admin["scope"]["tenants"] == 2 and admin["scope"]["keys"] >= 2
    assert "of every tenant (2 tenants)" in admin["verdict_text"]
    assert admin["result"]["key"]["tenant"] == "acme"
    # The ledger basis: this exact text is acme's recorded generation, named in acme's and the
    # admin's reports; globex cannot see acme's ledger.
    assert acme["basis"] == ["watermark", "ledger"] and generated["generation_id"] in acme["verdict_text"]
    assert acme["result"]["ledger_matches"][0]["generation_id"] == generated["generation_id"]
    assert globex["result"]["ledger_matches"] == [] and generated["generation_id"] not in json.dumps(globex)


def test_a_lenient_threshold_is_never_signed_as_watermarked(server, generated):
    # A tenant token may choose only powers of ten (service/access); the operator tier any threshold.
    response = _client(server, "admin").post("/v1/detect", json={"text": HUMAN, "threshold": 0.999999,
                                                                  "tenant": "acme"}).json()
    assert response["watermarked"] is True  # the API's field: the global p is below 0.999999
    statement = verify_report(response["report"], _keys(server), text=HUMAN).statement
    assert statement["verdict"] == "passes_lenient_threshold" and statement["basis"] == []
    assert statement["settings"]["threshold"] == 0.999999
    assert statement["verdict_text"] == ("passes the threshold 0.999999 under one of the 1 key of tenant acme; "
                                         "a threshold above 0.001 is not evidence of a watermark")
    # Just above 1e-3 is lenient too; so is 1e-3 itself at the gateway, whose signing policy
    # (HALLMARK_SIGNED_MAX_P, 1e-6: issue 31) signs "watermarked" only at or below its maximum.
    for threshold, verdict in ((0.0011, "passes_lenient_threshold"), (0.001, "passes_lenient_threshold"),
                               (1e-6, "watermarked")):
        out = _client(server, "admin").post("/v1/detect", json={"text": generated["text"], "threshold": threshold,
                                                                "tenant": "acme"}).json()
        assert out["watermarked"]
        assert verify_report(out["report"], _keys(server)).statement["verdict"] == verdict


def test_a_report_states_the_input_the_detector_and_the_settings(server, generated):
    from transformers import AutoTokenizer

    from service.model_paths import resolve_model_path

    text = generated["text"]
    before = datetime.now(timezone.utc)
    body = {"text": text, "threshold": 1e-4, "statistic": "max", "test": "sum", "spans": False, "evidence": True,
            "tenant": "acme"}
    response = _client(server, "admin").post("/v1/detect", json=body).json()
    after = datetime.now(timezone.utc)
    check = verify_report(response["report"], _keys(server), text=text)
    statement = check.statement
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(gw.TEST_MODEL))
    ids = tokenizer._tokenizer.encode(text, add_special_tokens=False).ids
    # An exact copy of a recorded generation is scored on the ids the model wrote (issue 30):
    # the report names those, whatever encode makes of the text.
    assert response["scored_as"] == "generation_ids"
    ids = generated["token_ids"]
    assert statement["subject"] == {"input": "text", "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
                                    "token_ids_sha256": hash_token_ids(ids), "tokens": len(ids)}
    assert statement["settings"] == {"threshold": 1e-4, "statistic": "max", "test": "sum", "spans": False,
                                     "span_min_length": 32, "normalize": True,
                                     "ledger": {"kgram_length": 8, "shared_tokens_level": 0.001, "matches_tested": 5}}
    digest = hashlib.sha256(canonical_json(statement["settings"])).hexdigest()
    assert statement["detector"] == {"version": "hallmark-detector/3", "config_sha256": digest,
                                     "id": f"hallmark-detector/3+{digest[:16]}"}
    assert before <= datetime.strptime(statement["created_at"], "%Y-%m-%dT%H:%M:%S.%f%z") <= after
    # The result as shown, less the per-token evidence, the per-key table and the report.
    assert statement["result"] == {k: v for k, v in response.items() if k not in REPORT_OMITS}
    assert "evidence" in response and "evidence" not in statement["result"]
    # Other settings, another detector id; token ids as input, no text hash.
    default = _client(server).post("/v1/detect", json={"token_ids": generated["token_ids"]}).json()
    other = verify_report(default["report"], _keys(server), token_ids=generated["token_ids"]).statement
    assert other["detector"]["id"] != statement["detector"]["id"]
    assert other["settings"]["normalize"] is None and other["subject"]["input"] == "token_ids"
    assert other["subject"]["text_sha256"] is None
    assert other["subject"]["token_ids_sha256"] == hash_token_ids(generated["token_ids"])
    # Normalisation changes the text scored, not the text hashed: the report is about the text as sent.
    sneaky = text.replace(" ", " \u200b", 3)
    normalized = _client(server).post("/v1/detect", json={"text": sneaky}).json()
    assert normalized["normalization"]["changed"]
    assert verify_report(normalized["report"], _keys(server), text=sneaky).text_matches


def test_report_verify_against_the_running_gateway(server, generated, tmp_path):
    response = _client(server).post("/v1/detect", json={"text": generated["text"]}).json()
    saved, text, other = tmp_path / "response.json", tmp_path / "text.txt", tmp_path / "other.txt"
    saved.write_text(json.dumps(response))
    text.write_bytes(generated["text"].encode())
    other.write_bytes((generated["text"] + "!").encode())
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "service.cli", "report", "verify", *args], env=env,
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    vkey = tmp_path / "log.vkey"  # the log key, pinned (here from the gateway itself: first use)
    vkey.write_text(httpx.get(server.url + "/.well-known/hallmark-keys.json").json()["log"]["vkey"] + "\n")
    ok = cli(str(saved), "--url", server.url, "--text-file", str(text), "--trust-log-key", str(vkey))
    assert ok.returncode == 0, ok.stderr
    assert "watermarked: passes the threshold 1e-06 under one of the 1 key of tenant acme" in ok.stdout
    assert ok.stdout.rstrip().endswith("; the text matches")
    wrong = cli(str(saved), "--url", server.url, "--text-file", str(other), "--trust-log-key", str(vkey))
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1
    assert wrong.stderr.startswith("error: report rejected: the text does not match the report")


def test_a_report_signs_only_what_the_shown_result_contains():
    """An access tier that shows a verdict in words and a confidence band, without p-value
    digits, gets a report with exactly those: report_statement adds nothing it withholds."""
    shown = {"watermarked": True, "verdict": "watermarked", "confidence": "very high", "threshold": 1e-06,
             "basis": ["watermark"], "report": None, "evidence": {"tokens": []}, "per_key": [{"p_value": 1e-40}]}
    scope = {"keys_of": "public", "tenant": None, "tenants": 3, "keys": 7}
    settings = {"threshold": 1e-06, "statistic": "auto", "test": "auto", "spans": True, "span_min_length": 32,
                "normalize": True, "ledger": None}
    statement = report_statement(shown, text="some text", token_ids=[1, 2, 3], scope=scope, settings=settings,
                                 now=datetime(2026, 12, 2, tzinfo=timezone.utc))
    assert statement["result"] == {"watermarked": True, "verdict": "watermarked", "confidence": "very high",
                                   "threshold": 1e-06, "basis": ["watermark"]}
    assert statement["verdict_text"] == "watermarked: passes the threshold 1e-06 under one of the 7 keys of the public key set"
    assert "1e-40" not in json.dumps(statement) and statement["created_at"] == "2026-12-02T00:00:00.000000Z"
    assert statement["detector"]["config_sha256"] == config_sha256(settings)
