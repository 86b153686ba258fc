"""Nothing sent goes unrecorded: a stream's record exists before its first token, it is
checkpointed at most every 32 tokens, and whatever ends it (engine failure, remote error,
timeout, client disconnect) ends in a `finished` entry with its reason. Every streaming
event names its generation. Receipts and detection reports verify against the published
keys. A scripted engine makes each failure happen at a chosen token."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass

import httpx
import pytest

from ledger.chain import hash_token_ids
from keys.db import open_store
from ledger.entries import CHECKPOINT_TOKENS, generation_entries, get_generation, hash_output
from keys.lifecycle import revoke_key
from ledger.receipts import public_keys, verify_receipt, verify_signed
from service.app import create_app
from service.engines.base import Delta, EngineBusy, EngineFailure, Finished, RouteCounts
from service.engines.vllm.remote import RemoteError
from service.settings import ServiceSettings
from tests.service import gateway as gw


class _Tokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 500 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"w{i} " for i in ids)


@dataclass
class Behaviour:
    fail_at: int | None = None
    exc: BaseException | None = None
    delay: float = 0.0
    per_delta: int = 1
    on_start: object = None


class ScriptedEngine:
    name = "scripted"
    model_name = "scripted-model"
    ready = True

    def __init__(self) -> None:
        self.behaviour = Behaviour()

    def tokenizer(self):
        return _Tokenizer()

    def check(self, request) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def generate(self, request):
        b = self.behaviour
        if b.on_start is not None:
            await asyncio.to_thread(b.on_start, request)
        ids: list[int] = []
        routes = RouteCounts()
        i = 0
        while i < request.max_tokens:
            if b.fail_at is not None and i >= b.fail_at:
                raise b.exc
            if b.delay:
                await asyncio.sleep(b.delay)
            step = list(range(i, min(i + b.per_delta, request.max_tokens)))
            ids.extend(100 + t for t in step)
            routes = RouteCounts(key_a=len(ids))
            yield Delta(text="".join(f"w{100 + t} " for t in step), token_ids=tuple(100 + t for t in step),
                        routes=routes)
            i += len(step)
        yield Finished(text="".join(f"w{t} " for t in ids), token_ids=tuple(ids), finish_reason="length",
                       prompt_tokens=len(request.prompt_ids), routes=routes)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store_settings, tokens = gw.provision(tmp_path_factory.mktemp("stream"))
    engine = ScriptedEngine()
    app = create_app(ServiceSettings(generation_timeout_s=2.0, max_tokens_cap=1024, detect_rate_per_minute=100_000,
                                     detect_burst=100_000), engine=engine, store_settings=store_settings)
    url, uv, thread = gw.serve(app)
    store = open_store(store_settings, require_kek=True)
    yield type("S", (), {"url": url, "tokens": tokens, "engine": engine, "store": store})
    store.close()
    uv.should_exit = True
    thread.join(30)


@pytest.fixture(autouse=True)
def _reset(server):
    server.engine.behaviour = Behaviour()


def _client(server, who="acme"):
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens[who]}"}, timeout=60)


def _events(response) -> list[dict]:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _entries(server, generation_id):
    with server.store.transaction(write=False) as session:
        return generation_entries(session, generation_id=generation_id, tenant_id=None)


def _wait_final(server, generation_id, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        entries = _entries(server, generation_id)
        if entries and entries[-1].kind == "finished":
            return entries
        time.sleep(0.05)
    raise AssertionError(f"no finished entry for {generation_id}: {[e.kind for e in _entries(server, generation_id)]}")


def test_record_before_first_token_checkpoints_and_generation_id_everywhere(server):
    seen = {}

    def on_start(request):  # runs inside the engine, before it produces anything
        seen["kinds"] = [e.kind for e in _entries(server, request.request_id)]

    server.engine.behaviour = Behaviour(on_start=on_start, per_delta=3)
    with _client(server).stream("POST", "/v1/generate", json={"prompt": "hi", "max_tokens": 100,
                                                               "stream": True}) as response:
        events = _events(response)
    gid = events[0]["generation_id"]
    assert seen["kinds"] == ["started"]
    assert events[0]["type"] == "started" and all(e.get("generation_id") == gid for e in events)
    assert events[-1]["type"] == "done"
    entries = _wait_final(server, gid)
    counts = [e.output_tokens for e in entries]
    assert entries[0].kind == "started" and counts[0] == 0 and counts[-1] == 100
    assert all(b - a <= CHECKPOINT_TOKENS for a, b in zip(counts, counts[1:])), counts
    assert all(e.kind == "checkpoint" for e in entries[1:-1]) and len(entries) >= 5
    # Each checkpoint commits to exactly the prefix that had been sent.
    sent_ids = [t for e in events if e["type"] == "delta" for t in e["token_ids"]]
    for entry in entries[1:-1]:
        assert entry.token_ids_sha256 == hash_token_ids(sent_ids[:entry.output_tokens])
    # The receipt in the done event verifies against the published keys, with the text, and
    # its final entry is in the transparency log (the proof it carries).
    from ledger.keyset import trusted_keys
    from ledger.log.note import Verifier

    keyset = httpx.get(server.url + "/.well-known/hallmark-keys.json").json()
    done = events[-1]
    statement = verify_receipt(done["receipt"], trusted_keys(keyset, Verifier.parse(keyset["log"]["vkey"])),
                               text=done["text"])
    assert done["receipt"]["log"]["leaf_index"] == statement["ledger"]["leaf_index"]
    assert statement["ledger"]["seq"] == entries[-1].seq and statement["ledger"]["entry_hash"] == entries[-1].entry_hash
    assert statement["token_ids_sha256"] == hash_token_ids(done["token_ids"]) and statement["finish_reason"] == "length"


def test_openai_stream_chunks_carry_the_generation_id(server):
    with _client(server).stream("POST", "/v1/completions", json={"prompt": "hi", "max_tokens": 5,
                                                                 "stream": True}) as response:
        chunks = _events(response)
    gid = chunks[0]["hallmark"]["generation_id"]
    assert all(c["id"] == "cmpl-" + gid and c["hallmark"]["generation_id"] == gid for c in chunks)
    # No key secret (written "0x" and 16 hex digits) in any chunk. A bare "0x" is not a leak:
    # the receipt's base64 signature contains it by chance in about one run in twenty.
    assert not re.search(r"0x[0-9a-fA-F]{16}", json.dumps(chunks)) and "receipt" in chunks[-1]["hallmark"]


@pytest.mark.parametrize("exc, reason", [
    (EngineFailure("the engine step failed"), "engine_failure"),
    (EngineBusy("the queue is full"), "engine_failure"),
    (RuntimeError("boom"), "engine_failure"),
    (RemoteError("the vLLM server failed the request: x"), "remote_error"),
    (httpx.ReadError("connection reset"), "remote_error"),
])
def test_a_failure_mid_stream_ends_in_a_record_of_what_was_sent(server, exc, reason):
    server.engine.behaviour = Behaviour(fail_at=45, exc=exc)
    with _client(server).stream("POST", "/v1/generate", json={"prompt": "hi", "max_tokens": 100,
                                                               "stream": True}) as response:
        events = _events(response)
    gid = events[0]["generation_id"]
    error = events[-1]
    assert error["type"] == "error" and error["generation_id"] == gid and "recorded" in error["error"]["message"]
    sent_ids = [t for e in events if e["type"] == "delta" for t in e["token_ids"]]
    sent_text = "".join(e["text"] for e in events if e["type"] == "delta")
    final = _wait_final(server, gid)[-1]
    assert len(sent_ids) == 45 and (final.finish_reason, final.output_tokens) == (reason, 45)
    assert final.token_ids_sha256 == hash_token_ids(sent_ids) and final.output_sha256 == hash_output(sent_text)
    shown = _client(server).get(f"/v1/generations/{gid}").json()
    assert shown["finish_reason"] == reason and shown["status"] == "finished"


def test_a_stream_past_the_deadline_ends_as_timeout(server):
    server.engine.behaviour = Behaviour(delay=0.05)
    with _client(server).stream("POST", "/v1/generate", json={"prompt": "hi", "max_tokens": 1000,
                                                               "stream": True}) as response:
        events = _events(response)
    gid = events[0]["generation_id"]
    assert events[-1]["type"] == "error" and "limit" in events[-1]["error"]["message"]
    sent = sum(len(e["token_ids"]) for e in events if e["type"] == "delta")
    final = _wait_final(server, gid)[-1]
    assert final.finish_reason == "timeout" and final.output_tokens == sent and 5 < sent < 100


def test_a_client_that_leaves_mid_stream_leaves_a_record(server):
    server.engine.behaviour = Behaviour(delay=0.01)
    received = []
    with _client(server).stream("POST", "/v1/generate", json={"prompt": "hi", "max_tokens": 1000,
                                                               "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(json.loads(line[6:]))
            if len(received) >= 40:
                break
    gid = received[0]["generation_id"]
    final = _wait_final(server, gid)[-1]
    sent = sum(len(e["token_ids"]) for e in received if e["type"] == "delta")
    assert final.finish_reason == "client_disconnect" and final.output_tokens >= sent


def test_non_streaming_output_under_a_key_revoked_meanwhile_is_withheld(server):
    def revoke(request):
        with server.store.transaction() as session:
            revoke_key(session, key_id=request.watermark.key_id, reason="leaked during the test", actor="test")

    server.engine.behaviour = Behaviour(on_start=revoke)
    response = _client(server, "globex").post("/v1/generate", json={"prompt": "hi", "max_tokens": 5})
    assert response.status_code == 503 and "revoked" in response.json()["error"]["message"]
    assert "text" not in response.json()


def test_detection_report_is_signed_and_says_what_it_rests_on(server):
    generated = _client(server).post("/v1/generate", json={"prompt": "hi", "max_tokens": 20}).json()
    assert generated["receipt"]["statement"]["generation_id"] == generated["generation_id"]
    result = _client(server).post("/v1/detect", json={"token_ids": generated["token_ids"]}).json()
    keyset = httpx.get(server.url + "/.well-known/hallmark-keys.json").json()
    report = verify_signed(result["report"], public_keys(keyset), expected_type="hallmark.detection_report")
    assert report["version"] == 2 and report["verdict"] in ("watermarked", "not_watermarked")
    shown = report["result"]
    assert shown["keys_tested"] == result["keys_tested"] and shown["log10_p_value"] == result["log10_p_value"]
    assert shown["correction"] == result["correction"] and report["detector"]["id"].startswith("hallmark-detector/")
    assert report["subject"] == {"input": "token_ids", "text_sha256": None, "tokens": len(generated["token_ids"]),
                                 "token_ids_sha256": hash_token_ids(generated["token_ids"])}
    if result["ledger_matches"]:
        assert shown["ledger_matches"][0]["generation_id"] == result["ledger_matches"][0]["generation_id"]
        assert "ledger" in report["basis"]
    tampered = json.loads(json.dumps(result["report"]))
    tampered["statement"]["verdict"] = "watermarked" if report["verdict"] == "not_watermarked" else "not_watermarked"
    with pytest.raises(Exception, match="bad signature"):
        verify_signed(tampered, public_keys(keyset))


def test_remote_style_output_is_verified_before_it_is_recorded(server):
    """An engine other than the local one is checked with the detector: this scripted one
    does not watermark, so its output is recorded as watermark_unverified and counted."""
    generated = _client(server).post("/v1/generate", json={"prompt": "hi", "max_tokens": 40}).json()
    assert generated["watermark"]["verification"]["verified"] is False
    final = _entries(server, generated["generation_id"])[-1]
    assert final.details["watermark_verified"] is False and final.details["watermark_log10_p"] > -3
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {server.tokens['admin']}"}).text
    assert 'hallmark_watermark_unverified_total{engine="scripted"}' in metrics
