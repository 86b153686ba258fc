"""The transparency log as C2SP tlog-tiles (service.ledger_log, /v1/ledger/log): served
without a token, full tiles immutable, only what a published checkpoint covers; and read by
an implementation nobody here wrote: a Go program on golang.org/x/mod/sumdb/tlog
(tests/service/go_tile_reader) that authenticates the tiles against the checkpoint and
proves a receipt's leaf and the log's consistency from them alone.

The Go reader needs Debian's golang-go and golang-golang-x-mod-dev (`make test` installs
them, scripts/ensure-go.sh); without them it skips, except in CI (HALLMARK_REQUIRE_GO=1)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.log import tiles, tlog
from ledger.log.leaves import SIGNING_KEY, entry_leaf
from ledger.log.note import NoteSigner
from tests.service import gateway
from tests.service.test_tamper_matrix import _generate

GOPATH = Path("/usr/share/gocode")
READER = Path(__file__).parent / "go_tile_reader"


def _go_reader(tmp_path: Path) -> Path:
    missing = shutil.which("go") is None or not (GOPATH / "src/golang.org/x/mod/sumdb/tlog").is_dir()
    if missing:
        if os.environ.get("HALLMARK_REQUIRE_GO") == "1":
            pytest.fail("Go and golang.org/x/mod are required here (HALLMARK_REQUIRE_GO=1): run scripts/ensure-go.sh")
        pytest.skip("the independent tile reader needs golang-go and golang-golang-x-mod-dev (scripts/ensure-go.sh)")
    binary = tmp_path / "tile-reader"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOFLAGS": "",
           "GOCACHE": str(tmp_path / "gocache")}
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=READER, env=env, check=True, timeout=300)
    return binary


def test_tiles_are_served_and_read_by_go_sumdb_tlog(tmp_path):
    reader = _go_reader(tmp_path)
    running = gateway.start(tmp_path)
    try:
        services = running.app.state.services
        first = services.publish_checkpoint()
        outputs = [_generate(running.url, running.tokens["acme"], "The function returns", seed) for seed in (1, 2)]
        size = services.publish_checkpoint()
        vkey = services.log_authority().verifier.vkey
        prefix = running.url + "/v1/ledger/log"
        checkpoint = httpx.get(prefix + "/checkpoint")
        assert checkpoint.status_code == 200 and checkpoint.text.split("\n")[1] == str(size)
        assert checkpoint.headers["content-type"] == "text/plain; charset=utf-8"
        for partial in tiles.tiles_for(size):
            got = httpx.get(f"{prefix}/{partial.path}")
            assert got.status_code == 200 and got.headers["content-type"] == "application/octet-stream"
            assert "immutable" not in got.headers["cache-control"]
        assert httpx.get(f"{prefix}/tile/0/000.p/{size + 1}").status_code == 404  # beyond what is published
        assert httpx.get(f"{prefix}/tile/0/0").status_code == 404  # not a tile path
        for out in outputs:
            receipt = out["receipt"]
            index = receipt["log"]["leaf_index"]
            done = subprocess.run([str(reader), prefix, vkey, str(index), str(first)], capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
            read = json.loads(done.stdout)
            assert read["size"] == size and read["leaf_index"] == index
            ledger = receipt["statement"]["ledger"]
            assert base64.b64decode(read["entry"]) == entry_leaf(ledger["entry_hash"], ledger["kgrams_sha256"])
        # Past 256 leaves (key-event leaves appended as the log appends them): full tiles are
        # immutable, and the reader authenticates level-1 tiles too.
        with services.store.transaction() as session:
            auth = tlog.required_authority(session)
            start, _ = tlog.read_head(session, auth)
            for i in range(300 - start):
                event = json.dumps({"test": i}).encode()
                tlog.append(session, auth, leaf_data=bytes([SIGNING_KEY]) + event, kind="signing_key", kid=f"t{i}",
                            data=event)
        big = services.publish_checkpoint()
        full = httpx.get(f"{prefix}/tile/0/000")
        assert full.status_code == 200 and len(full.content) == 8192
        assert "immutable" in full.headers["cache-control"]
        assert len(httpx.get(f"{prefix}/tile/1/000.p/1").content) == 32
        index = outputs[0]["receipt"]["log"]["leaf_index"]
        done = subprocess.run([str(reader), prefix, vkey, str(index), str(size)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["size"] == big > 256
        # A log key it was not given: the reader refuses the checkpoint.
        other = NoteSigner(vkey.split("+")[0], Ed25519PrivateKey.generate()).verifier.vkey
        refused = subprocess.run([str(reader), prefix, other, "0", "0"], capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and "does not verify" in refused.stderr
    finally:
        running.stop()
