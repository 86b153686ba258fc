"""A remote ``vllm serve`` deployment, reached over its OpenAI-compatible API.

The server runs Hallmark's plugin with its own keyring file (:mod:`.keyring`); requests
carry only the key id and stream seed in ``vllm_xargs``, never key material. Streaming
uses ``/v1/completions`` with a token-id prompt and ``return_token_ids`` (vLLM's
extension), so text is decoded here exactly as for the in-process engine. Closing the
stream closes the HTTP response, and vLLM aborts a request whose client disconnected.

The server must not be reachable by anyone but the gateway: a client that can call it
can ask for any key id in the keyring. Run it on a private network with ``--api-key``
(sent here as a bearer token, :attr:`api_key`).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import httpx

from service.engines.vllm.backend import Chunk, Sampling


class RemoteError(RuntimeError):
    """The remote vLLM server refused or failed a request; the message says which."""


def check_remote_url(url: str, *, api_key: str | None, allow_insecure_http: bool) -> None:
    """A vLLM server off this host is reached over https with an API key: whoever can call
    it can ask for any key id of its keyring. ``allow_insecure_http`` waives this for a
    private network the operator vouches for."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback or allow_insecure_http:
        return
    if parts.scheme != "https" or not api_key:
        raise RemoteError(f"the vLLM server at {url} is not on this host: use https and an API key "
                          "(HALLMARK_VLLM_API_KEY), or set HALLMARK_VLLM_ALLOW_INSECURE_HTTP=1 for a private "
                          "network you trust")


class RemoteBackend:
    """The OpenAI-compatible server of a ``vllm serve`` deployment."""

    sends_key_material = False

    def __init__(self, url: str, *, model_name: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, transport: httpx.AsyncBaseTransport | None = None,
                 allow_insecure_http: bool = False) -> None:
        self.url = url.rstrip("/")
        self._allow_insecure_http = allow_insecure_http
        self.model_name = model_name or ""
        self._api_key = api_key
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._ready = False

    def __repr__(self) -> str:  # never show the API key
        return f"RemoteBackend(url={self.url!r}, model_name={self.model_name!r})"

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        check_remote_url(self.url, api_key=self._api_key, allow_insecure_http=self._allow_insecure_http)
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._client = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=self._timeout,
                                         transport=self._transport)
        try:
            response = await self._client.get("/v1/models")
        except httpx.HTTPError as exc:
            await self.stop()
            raise RemoteError(f"cannot reach the vLLM server at {self.url}: {exc.__class__.__name__}; "
                              "check --vllm-url and that `vllm serve` is running") from None
        if response.status_code != 200:
            await self.stop()
            raise RemoteError(f"the vLLM server at {self.url} answered {response.status_code} to "
                              "/v1/models; check its --api-key (HALLMARK_VLLM_API_KEY)")
        served = [model["id"] for model in response.json().get("data", [])]
        if not self.model_name:
            if not served:
                raise RemoteError(f"the vLLM server at {self.url} serves no model")
            self.model_name = served[0]
        elif self.model_name not in served:
            await self.stop()
            raise RemoteError(f"the vLLM server at {self.url} serves {served}, not {self.model_name!r}; "
                              "fix --model")
        await self._prove_plugin()
        self._ready = True

    async def _prove_plugin(self) -> None:
        """Without the Hallmark plugin, vLLM passes a request's extra args through unchecked
        and generates unwatermarked text. Prove it enforces: a key id no keyring holds must
        be refused."""
        from service.engines.vllm.watermark_args import KEY_ID, SEED

        body = {"model": self.model_name, "prompt": [0], "max_tokens": 1, "stream": False,
                "vllm_xargs": {KEY_ID: f"hallmark-probe-{secrets.token_hex(8)}", SEED: 0}}
        try:
            response = await self._client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            await self.stop()
            raise RemoteError(f"cannot reach the vLLM server at {self.url}: {exc.__class__.__name__}") from None
        if response.status_code == 200:
            await self.stop()
            raise RemoteError(f"the vLLM server at {self.url} does not run the Hallmark plugin (it generated "
                              "for a key id no keyring holds); start it with the plugin and its keyring")

    async def stop(self) -> None:
        self._ready = False
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _body(self, prompt_ids: tuple[int, ...], sampling: Sampling, extra_args: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model_name, "prompt": list(prompt_ids), "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "n": 1, "stream": True, "return_token_ids": True, "skip_special_tokens": True,
            # Explicit, so that a model's generation_config.json defaults (which vLLM
            # applies to fields a request leaves out) cannot switch these on.
            "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_p": 0.0,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed % (2**63)
        if extra_args:
            body["vllm_xargs"] = dict(extra_args)
        return body

    async def stream(self, request_id: str, prompt_ids: tuple[int, ...], sampling: Sampling,
                     extra_args: dict[str, Any]) -> AsyncIterator[Chunk]:
        if self._client is None:
            raise RemoteError("the remote vLLM backend is not started")
        body = self._body(prompt_ids, sampling, extra_args)
        headers = {"X-Request-Id": request_id}
        async with self._client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")
                raise RemoteError(f"the vLLM server refused the request ({response.status_code}): "
                                  f"{_error_message(detail)}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise RemoteError(f"the vLLM server failed the request: {_error_message(data)}")
                for choice in event.get("choices", []):
                    yield Chunk(token_ids=tuple(choice.get("token_ids") or ()),
                                finish_reason=choice.get("finish_reason"))


def _error_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:300]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(error)[:300]
