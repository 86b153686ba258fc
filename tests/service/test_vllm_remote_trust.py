"""The gateway does not trust a remote vLLM server blindly: off this host it needs https and
an API key (unless the operator allows plain http), and at start the server must prove
it runs the Hallmark plugin by refusing a key id no keyring holds."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from service.engines.vllm.remote import RemoteBackend, RemoteError, check_remote_url


@pytest.mark.parametrize("url, api_key, allowed", [
    ("http://127.0.0.1:8000", None, True),
    ("http://localhost:8000", None, True),
    ("http://[::1]:8000", None, True),
    ("http://10.0.0.5:8000", "k", False),
    ("https://vllm.internal:8000", None, False),
    ("https://vllm.internal:8000", "k", True),
])
def test_non_loopback_urls_need_https_and_an_api_key(url, api_key, allowed):
    if allowed:
        check_remote_url(url, api_key=api_key, allow_insecure_http=False)
    else:
        with pytest.raises(RemoteError, match="https and an API key"):
            check_remote_url(url, api_key=api_key, allow_insecure_http=False)
        check_remote_url(url, api_key=api_key, allow_insecure_http=True)


def _server(completion_status: int) -> httpx.MockTransport:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        seen.append(json.loads(request.content))
        if completion_status == 200:
            return httpx.Response(200, json={"choices": [{"text": "x", "token_ids": [5]}]})
        return httpx.Response(400, json={"error": {"message": "unknown hallmark_key_id"}})

    transport = httpx.MockTransport(handler)
    transport.seen = seen
    return transport


def test_a_server_without_the_plugin_is_refused_at_start():
    transport = _server(200)  # vLLM without the plugin: extra args pass through, it generates
    backend = RemoteBackend("http://127.0.0.1:9", transport=transport)
    with pytest.raises(RemoteError, match="does not run the Hallmark plugin"):
        asyncio.run(backend.start())
    assert not backend.ready
    assert transport.seen[0]["vllm_xargs"]["hallmark_key_id"].startswith("hallmark-probe-")


def test_a_server_that_refuses_an_unknown_key_id_is_accepted():
    backend = RemoteBackend("http://127.0.0.1:9", transport=_server(400))
    asyncio.run(backend.start())
    assert backend.ready
    asyncio.run(backend.stop())


def test_the_plugin_keyring_refuses_verify_only_and_revoked_keys(tmp_path):
    from service.engines.vllm.keyring import Keyring, KeyringEntry, KeyringError, write_keyring
    from watermark.key import WatermarkKey

    keys = {state: WatermarkKey(secret=0x1234_0000 + i) for i, state in enumerate(("active", "verify-only", "revoked"))}
    path = write_keyring(tmp_path / "keyring.json", [
        KeyringEntry(key_id=f"key_{state}", tenant="acme", version=i + 1, fingerprint=key.fingerprint, key=key,
                     state=state) for i, (state, key) in enumerate(keys.items())])
    ring = Keyring(path)
    assert ring.lookup("key_active").key == keys["active"]
    for state in ("verify-only", "revoked"):
        with pytest.raises(KeyringError, match=f"is {state}: this vLLM server generates only with active keys"):
            ring.lookup(f"key_{state}")
    # A keyring written before states were kept reads its keys as active.
    data = json.loads(path.read_text())
    for entry in data["keys"].values():
        entry.pop("state")
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    assert Keyring(path).lookup("key_revoked").state == "active"
