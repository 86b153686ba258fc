"""The HTTP contract under bad input: every client mistake is a clear 4xx (never a 5xx),
every error has the one shape {"error": {message, type, code}}, over-limit bodies get a
413 that common clients can read (chunked or not), and a tenant without an active key gets
a non-retryable 409. One gateway (bundled models) for the module."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import httpx
import pytest

from keys.db import open_store
from keys.tenants import create_tenant
from keys.tokens import issue_token
from tests.service import gateway as gw

pytestmark = pytest.mark.slow

VOCAB = 8192  # the bundled model's vocabulary


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("contract"), draft_model=None, max_body_bytes=4096,
                       max_tokens_cap=64, default_max_tokens=16)
    store = open_store(gateway.store_settings)
    try:
        with store.transaction() as session:
            create_tenant(session, name="keyless", actor="test")
            gateway.tokens["keyless"] = issue_token(session, tenant="keyless", actor="test").raw_token
    finally:
        store.close()
    yield gateway
    gateway.stop()


def _headers(server, who="acme"):
    return {"Authorization": f"Bearer {server.tokens[who]}"}


def _post(server, path, body, who="acme"):
    # json.dumps escapes lone surrogates as \udXXX, as a JavaScript client would send them.
    return httpx.post(server.url + path, content=json.dumps(body).encode(), timeout=120,
                      headers={**_headers(server, who), "Content-Type": "application/json"})


def _assert_error(response, status, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["message"] and isinstance(error["code"], str)
    if code is not None:
        assert error["code"] == code, error
    return error


HUGE = 9223372036854775808


@pytest.mark.parametrize("path,body", [
    ("/v1/generate", {"prompt": "x", "max_tokens": 1, "top_k": HUGE}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "top_k": HUGE}),
    ("/v1/generate", {"prompt": "x", "max_tokens": 1, "top_k": VOCAB + 1}),
    ("/v1/completions", {"prompt": [5, VOCAB], "max_tokens": 1}),  # a prompt id beyond the vocabulary
    ("/v1/generate", {"prompt": "x", "seed": 2**53}),
    ("/v1/generate", {"prompt": "x", "seed": -1}),
    ("/v1/generate", {"prompt": "x", "stop": [""]}),
    ("/v1/generate", {"prompt": "x", "stop": ["a"] * 9}),
    ("/v1/generate", {"prompt": "x", "max_tokens": "5"}),
    ("/v1/generate", {"prompt": "x", "stream": 0}),
    ("/v1/generate", {"prompt": "x", "watermark": 0}),
    ("/v1/completions", {"prompt": "x", "stream": 0}),
    ("/v1/generate", {"prompt": "x", "max_tokens": 65}),  # above this server's cap
    ("/v1/completions", {"prompt": "\ud800"}),
    ("/v1/generate", {"prompt": "a\udfffb"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/v1/detect", {"text": "\ud800"}),
    ("/v1/detect", {}),
    ("/v1/detect", {"text": "x", "token_ids": [1]}),
])
def test_client_mistakes_are_422(server, path, body):
    _assert_error(_post(server, path, body), 422)


@pytest.mark.parametrize("temperature", [1e-50, 1e-40, 1e-38, 1e-36, 0.009, -0.5, 101])
def test_tiny_and_out_of_range_temperatures_are_refused(server, temperature):
    error = _assert_error(_post(server, "/v1/generate", {"prompt": "x", "max_tokens": 2,
                                                         "temperature": temperature}), 422)
    assert "temperature" in error["message"]


def test_the_documented_edges_are_served(server):
    for body in ({"temperature": 0.01}, {"temperature": 0}, {"top_k": VOCAB}, {"seed": 2**53 - 1},
                 {"stop": "x" * 200}):
        response = _post(server, "/v1/generate", {"prompt": "The function", "max_tokens": 3, **body})
        assert response.status_code == 200, (body, response.text)
    response = _post(server, "/v1/completions", {"prompt": [[5, 6, 7]], "max_tokens": 2})
    assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 3
    chat = _post(server, "/v1/chat/completions", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]}]})
    assert chat.status_code == 200, chat.text


def test_a_page_offset_beyond_what_sql_takes_is_a_422(server):
    # Found by Schemathesis: an offset past 2^63 reached SQLite and came back a 500.
    for offset in (2 ** 62 + 1, HUGE, 10 ** 40):
        error = _assert_error(httpx.get(server.url + "/v1/generations", params={"offset": offset},
                                        headers=_headers(server)), 422)
        assert "offset" in error["message"]
    page = httpx.get(server.url + "/v1/generations", params={"offset": 2 ** 62}, headers=_headers(server))
    assert page.status_code == 200 and page.json()["generations"] == []


def test_unknown_routes_and_methods_have_the_error_shape(server):
    _assert_error(httpx.get(server.url + "/v1/nothing"), 404, "not_found")
    error = _assert_error(httpx.get(server.url + "/v1/generate", headers=_headers(server)), 405, "method_not_allowed")
    assert "POST" in error["message"]
    _assert_error(httpx.delete(server.url + "/healthz"), 405)


def test_bodies_that_are_not_json(server):
    error = _assert_error(httpx.post(server.url + "/v1/detect", content=b"{not json", headers={
        **_headers(server), "Content-Type": "application/json"}), 422, "invalid_json")
    assert "not valid JSON" in error["message"]
    _assert_error(httpx.post(server.url + "/v1/detect", content=b"text=hello", headers={
        **_headers(server), "Content-Type": "application/x-www-form-urlencoded"}), 415, "unsupported_media_type")
    # No Content-Type at all: read as JSON.
    response = httpx.post(server.url + "/v1/detect", content=json.dumps({"token_ids": [1, 2]}).encode(),
                          headers=_headers(server))
    assert response.status_code == 200, response.text


def test_oversized_bodies_get_a_readable_413(server):
    big = json.dumps({"text": "a" * 10_000}).encode()
    # Declared length.
    _assert_error(httpx.post(server.url + "/v1/detect", content=big, headers={
        **_headers(server), "Content-Type": "application/json"}), 413, "body_too_large")

    # Chunked (no Content-Length).
    def chunks():
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]

    _assert_error(httpx.post(server.url + "/v1/detect", content=chunks(), headers={
        **_headers(server), "Content-Type": "application/json"}), 413, "body_too_large")

    # urllib writes the whole body before reading the answer.
    request = urllib.request.Request(server.url + "/v1/detect", data=big, method="POST",
                                     headers={**_headers(server), "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413 and json.loads(refused.value.read())["error"]["code"] == "body_too_large"

    # A raw chunked upload far beyond the limit, with http.client.
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v1/detect", body=iter([b"x" * 4096] * 64), encode_chunked=True,
                       headers={**_headers(server), "Content-Type": "application/json"})
    answer = connection.getresponse()
    assert answer.status == 413 and json.loads(answer.read())["error"]["code"] == "body_too_large"
    connection.close()


def test_routed_statistic_without_a_keyed_coin_is_a_409(server):
    # Well formed, but acme's keys have no keyed acceptance coin: a state conflict, not a 500.
    response = _post(server, "/v1/detect", {"text": "x", "statistic": "routed"})
    _assert_error(response, 409, "statistic_unavailable")
    assert response.headers["x-should-retry"] == "false"


def test_integers_may_be_written_as_json_numbers_without_fraction(server):
    assert _post(server, "/v1/generate", {"prompt": "The", "max_tokens": 2.0, "top_k": 5.0}).status_code == 200
    _assert_error(_post(server, "/v1/generate", {"prompt": "The", "max_tokens": 2.5}), 422)


def test_no_active_key_is_a_non_retryable_409(server):
    error = _assert_error(_post(server, "/v1/generate", {"prompt": "x", "max_tokens": 2}, who="keyless"), 409,
                          "no_active_key")
    assert "keys create" in error["message"]
    # Greedy generation needs no key and still works.
    assert _post(server, "/v1/generate", {"prompt": "x", "max_tokens": 2, "temperature": 0},
                 who="keyless").status_code == 200


def test_openai_client_does_not_retry_a_409(server):
    openai = pytest.importorskip("openai")
    httpx2 = pytest.importorskip("httpx2")  # the HTTP library this openai client is built on
    calls = []
    transport = httpx2.HTTPTransport()

    class Counting(httpx2.BaseTransport):
        def handle_request(self, request):
            calls.append(request.url.path)
            return transport.handle_request(request)

    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.tokens["keyless"],
                        http_client=httpx2.Client(transport=Counting()))
    with pytest.raises(openai.ConflictError):
        api.completions.create(model="hallmark", prompt="x", max_tokens=2)
    assert len(calls) == 1
