"""`hallmark scan`: a corpus against a store's keys gives detect's verdicts, on worker
processes, through the GPU path's logic (Triton's interpreter), resumed after a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detector.detect import DetectorConfig
from detector.forms import detect_forms, text_forms
from detector.multikey import KeySet
from keys import migrate
from keys.db import open_store
from keys.kek import generate_kek_file
from keys.lifecycle import create_key, import_key
from keys.material import detection_keys
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from service.scan import run as scan_run
from service.scan.verdicts import ScanSettings
from service.key_scopes import candidate_of
from service.tokenization import load_text_encoder
from tests.synthetic import generate, generate_speculative, human_like
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

REPO = Path(__file__).resolve().parents[2]
SECRETS = {"acme": [0x1234_5678_9ABC_DEF1, 77, 2**63 + 5], "globex": [2**32 + 9, 0xDEAD_BEEF_0000_0001]}
SPECS = {"acme": [WatermarkSpec(algorithm="dual_key_gumbel"), WatermarkSpec(), WatermarkSpec(algorithm="dual_key_gumbel",
                                                                                               coin="keyed")],
         "globex": [WatermarkSpec(), WatermarkSpec(context_width=3, dedup="all")]}


@pytest.fixture(scope="module")
def store_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scan")
    kek = tmp / "kek.key"
    generate_kek_file(kek)
    settings = StoreSettings(database_url=f"sqlite:///{tmp / 'h.db'}", kek_file=kek)
    store = open_store(settings, require_kek=True, check_schema=False, create=True)
    try:
        migrate.upgrade(store.engine)
        with store.transaction() as session:
            for tenant, secrets in SECRETS.items():
                create_tenant(session, name=tenant, actor="test")
                for secret, spec in zip(secrets, SPECS[tenant]):
                    import_key(session, store.keyring, tenant=tenant, secret=secret, spec=spec, actor="test",
                               source="test")
            for _ in range(20):  # keys that wrote nothing here
                create_key(session, store.keyring, tenant="globex", actor="test")
        with store.transaction(write=False) as session:
            keys = [candidate_of(k) for k in detection_keys(session, store.keyring)]
    finally:
        store.close()
    env = {"HALLMARK_DATABASE_URL": settings.database_url, "HALLMARK_KEK_FILE": str(kek), "HALLMARK_ACTOR": "test"}
    return env, keys


def _corpus(path: Path, count: int = 24) -> list[dict]:
    keys = [WatermarkKey(s, spec) for t in SECRETS for s, spec in zip(SECRETS[t], SPECS[t])]
    rows = []
    for i in range(count):
        key = keys[i % len(keys)]
        kind = i % 6
        if kind == 0:
            tokens = (generate_speculative(key, 120, seed=i)[0] if key.spec.coin == "keyed"
                      else generate(key, 120, seed=i, scale=1.2)[0])
            rows.append({"id": f"marked-{i}", "token_ids": tokens})
        elif kind == 1:  # edited
            tokens = generate(keys[0], 200, seed=i)[0]
            rows.append({"id": i, "token_ids": [t if j % 4 else (t * 7 + 3) % 2000 for j, t in enumerate(tokens)]})
        elif kind == 2:
            rows.append({"token_ids": human_like(150, seed=i)})
        elif kind == 3:  # text with a zero-width space: two forms
            rows.append({"id": f"text-{i}", "text": "The quick brown\u200b fox jumps over the lazy dog. " * 3})
        elif kind == 4:
            rows.append({"id": f"short-{i}", "token_ids": [5, 6, 7]})
        else:  # nothing to score: that line's error, as /v1/detect's 422 (issue 25, item 8)
            rows.append({"id": f"empty-{i}", "token_ids": []})
    rows.insert(5, "{not json")
    rows.insert(9, {"token_ids": [1, 2, -3]})
    rows.insert(12, {"text": "a", "token_ids": [1]})
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
        handle.write("\n")  # blank lines are skipped
    return rows


def _failing(rows: list) -> set[int]:
    """The lines a scan answers with an error: the three malformed ones and the empty ones."""
    return {6, 10, 13} | {n for n, row in enumerate(rows, start=1) if isinstance(row, dict) and row.get("token_ids") == []}


def _verdicts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _expected(row: dict, keys, config: DetectorConfig) -> tuple:
    """What `hallmark detect --tenant/--all-tenants` decides for the row (every key in full)."""
    if "token_ids" in row:
        forms = [row["token_ids"]]
    else:
        encode = load_text_encoder("bundled").encode
        forms = [encode(form.text)[0] for form in text_forms(row["text"])[0]]
    result, _ = detect_forms(forms, keys, config)
    return result.watermarked, result.log10_p_value, result.key.to_dict() if result.key else None, \
        [(s.start, s.end) for s in result.spans]


def _check_against_detect(rows: list, verdicts: list[dict], keys, config) -> None:
    good = [(number, row) for number, row in enumerate(rows, start=1)
            if isinstance(row, dict) and ("text" in row) != ("token_ids" in row) and min(row.get("token_ids") or [0]) >= 0
            and row.get("token_ids") != []]
    by_line = {v["line"]: v for v in verdicts}
    assert len(by_line) == len(rows)  # every line answered once (the blank one skipped)
    for number, row in good:
        got = by_line[number]
        watermarked, log10_p, key, spans = _expected(row, keys, config)
        assert got["watermarked"] == watermarked, number
        assert abs(got["log10_p_value"] - log10_p) <= 1e-9 * max(1.0, abs(log10_p) * 1e-3), number
        assert got["key"] == key and [(s["start"], s["end"]) for s in got["spans"]] == spans, number
        assert got["keys_tested"] == len(keys) and "per_key" not in got
        assert got["id"] == row.get("id")
    errors = {v["line"] for v in verdicts if "error" in v}
    assert errors == _failing(rows)


def test_scan_gives_detects_verdicts_on_worker_processes(store_env, tmp_path):
    _, keys = store_env
    rows = _corpus(tmp_path / "in.jsonl")
    settings = ScanSettings(config=DetectorConfig(), tokenizer="bundled")
    one = scan_run.scan(tmp_path / "in.jsonl", tmp_path / "one.jsonl", KeySet.of(keys), settings, batch=5)
    two = scan_run.scan(tmp_path / "in.jsonl", tmp_path / "two.jsonl", KeySet.of(keys), settings, workers=2, batch=4)
    assert (one.items, one.failed) == (two.items, two.failed) == (len(rows), len(_failing(rows)))
    assert _verdicts(tmp_path / "one.jsonl") == _verdicts(tmp_path / "two.jsonl")  # in input order
    verdicts = _verdicts(tmp_path / "one.jsonl")
    assert [v["line"] for v in verdicts] == list(range(1, len(rows) + 1))
    assert sum(v.get("watermarked", False) for v in verdicts) >= 4
    _check_against_detect(rows, verdicts, keys, DetectorConfig())
    texts = [v for v in verdicts if str(v.get("id", "")).startswith("text-")]
    assert texts and all(v["normalization"]["changes"] == {"zero_width": 3} for v in texts)


def test_a_killed_scan_resumes_to_the_same_verdicts(store_env, tmp_path):
    _, keys = store_env
    _corpus(tmp_path / "in.jsonl")
    settings = ScanSettings(config=DetectorConfig(threshold=1e-4), tokenizer="bundled")
    full = tmp_path / "full.jsonl"
    scan_run.scan(tmp_path / "in.jsonl", full, KeySet.of(keys), settings, batch=3)
    partial = tmp_path / "partial.jsonl"

    class Killed(Exception):
        pass

    def kill_after_three_batches(items, failed, position):
        if items >= 9:
            raise Killed

    with pytest.raises(Killed):
        scan_run.scan(tmp_path / "in.jsonl", partial, KeySet.of(keys), settings, batch=3,
                      progress=kill_after_three_batches)
    with open(partial, "a", encoding="utf-8") as handle:
        handle.write('{"line": 10, "id": "half-writt')  # a kill in the middle of a line
    with pytest.raises(ValueError, match="--resume"):
        scan_run.scan(tmp_path / "in.jsonl", partial, KeySet.of(keys), settings)
    with pytest.raises(ValueError, match="other config"):
        scan_run.scan(tmp_path / "in.jsonl", partial, KeySet.of(keys), ScanSettings(tokenizer="bundled"),
                      resume=True)
    resumed = scan_run.scan(tmp_path / "in.jsonl", partial, KeySet.of(keys), settings, resume=True, batch=5)
    assert resumed.skipped == 9
    assert sorted(_verdicts(partial), key=lambda v: v["line"]) == _verdicts(full)


def test_the_cli_scans_a_tenant_and_reports_failed_lines(store_env, tmp_path):
    env, keys = store_env
    rows = _corpus(tmp_path / "in.jsonl", count=12)
    command = [sys.executable, "-m", "service.cli", "scan", str(tmp_path / "in.jsonl"), "--out",
               str(tmp_path / "out.jsonl"), "--tenant", "acme", "--tokenizer", "bundled", "--workers", "2", "--json"]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    failing = len(_failing(rows))
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {failing} line(s) failed")
    summary = json.loads(done.stdout)
    assert (summary["texts"], summary["failed"], summary["keys_tested"]) == (len(rows), failing, 3)
    acme = [k for k in keys if k.info.tenant == "acme"]
    _check_against_detect(rows, _verdicts(tmp_path / "out.jsonl"), acme, DetectorConfig())
    secrets = [str(s) for s in SECRETS["acme"] if s > 2**40] + [hex(s) for s in SECRETS["acme"] if s > 2**40]
    assert not any(s in (tmp_path / "out.jsonl").read_text() or s in done.stdout + done.stderr for s in secrets)
    again = subprocess.run(command, cwd=REPO, env={**os.environ, **env, "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "--resume" in again.stderr


def test_the_gpu_path_gives_the_cpu_verdicts_in_the_interpreter(store_env, tmp_path):
    """The GPU scan's logic (packing, one launch per key group, verdicts from its statistics)
    run through Triton's interpreter on CPU tensors: the verdicts of the CPU scan."""
    pytest.importorskip("triton")
    _, keys = store_env
    rows = [{"id": i, "token_ids": (generate(WatermarkKey(SECRETS["globex"][i % 2], SPECS["globex"][i % 2]), 40,
                                             seed=i)[0] if i % 2 == 0 else human_like(40, seed=i))} for i in range(4)]
    rows.append({"token_ids": []})
    with open(tmp_path / "in.jsonl", "w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows)
    globex = [k for k in keys if k.info.tenant == "globex"][:6]
    code = f"""
import json, pickle, sys
from pathlib import Path
from detector.multikey import KeySet
from service.scan import run
from service.scan.verdicts import ScanSettings
keys = pickle.loads(Path(sys.argv[1]).read_bytes())
run.scan(Path(sys.argv[2]), Path(sys.argv[3]), KeySet.of(keys), ScanSettings(), device="interpret", batch=3)
"""
    import pickle

    (tmp_path / "keys.pkl").write_bytes(pickle.dumps(globex))
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "keys.pkl"), str(tmp_path / "in.jsonl"),
                           str(tmp_path / "gpu.jsonl")], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    scan_run.scan(tmp_path / "in.jsonl", tmp_path / "cpu.jsonl", KeySet.of(globex), ScanSettings())
    assert _verdicts(tmp_path / "gpu.jsonl") == _verdicts(tmp_path / "cpu.jsonl")


@pytest.mark.gpu
def test_the_gpu_scan_gives_the_cpu_verdicts(store_env, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _, keys = store_env
    rows = _corpus(tmp_path / "in.jsonl")
    settings = ScanSettings(tokenizer="bundled")
    scan_run.scan(tmp_path / "in.jsonl", tmp_path / "gpu.jsonl", KeySet.of(keys), settings, device="cuda", batch=7)
    scan_run.scan(tmp_path / "in.jsonl", tmp_path / "cpu.jsonl", KeySet.of(keys), settings, batch=7)
    assert _verdicts(tmp_path / "gpu.jsonl") == _verdicts(tmp_path / "cpu.jsonl")
    _check_against_detect(rows, _verdicts(tmp_path / "gpu.jsonl"), keys, DetectorConfig())
