"""The OpenAI-compatible routes refuse what they cannot honour, as OpenAI and vLLM do: a model
they do not serve is a 404 `model_not_found` (the `openai` client's NotFoundError), and a
parameter that would change the output but is not implemented is a 400
`unsupported_parameter` whose `param` names it (BadRequestError with `.param`), never
silently ignored. Neutral values and the parameters that are supported keep working. A
scripted engine over a real HTTP server (fast)."""

from __future__ import annotations


import httpx
import pytest

from service.app import create_app
from service.routes.openai import ALIAS
from service.schemas import UNSUPPORTED, ChatBody, CompletionBody
from service.settings import ServiceSettings
from tests.service import gateway as gw
from tests.service.test_stream_provenance import ScriptedEngine

openai = pytest.importorskip("openai")

SERVED = ScriptedEngine.model_name
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
COMPLETION = {"prompt": "hi", "max_tokens": 3}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store_settings, tokens = gw.provision(tmp_path_factory.mktemp("openai"))
    app = create_app(ServiceSettings(max_tokens_cap=64, default_max_tokens=16), engine=ScriptedEngine(), store_settings=store_settings)
    url, uv, thread = gw.serve(app)
    yield type("S", (), {"url": url, "tokens": tokens})
    uv.should_exit = True
    thread.join(30)


@pytest.fixture
def api(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.tokens["acme"], max_retries=0)


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60,
                      headers={"Authorization": f"Bearer {server.tokens['acme']}"})


def test_unknown_model_is_404_model_not_found_naming_it_and_the_served_one(server, api):
    with pytest.raises(openai.NotFoundError) as caught:
        api.completions.create(model="gpt-4o", prompt="hi", max_tokens=3)
    assert caught.value.code == "model_not_found" and caught.value.type == "not_found_error"
    assert "'gpt-4o'" in caught.value.message and repr(SERVED) in caught.value.message
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model=SERVED.upper(), max_tokens=3, messages=CHAT["messages"])
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        response = _post(server, path, {**body, "model": "nope", "stream": True})
        assert response.status_code == 404 and set(response.json()["error"]) == {"message", "type", "code"}


def test_models_lists_exactly_the_accepted_ids_and_an_omitted_model_is_the_served_one(server, api):
    listed = [m.id for m in api.models.list().data]
    assert listed == [SERVED, ALIAS]
    for model in listed:
        out = api.completions.create(model=model, prompt="hi", max_tokens=3)
        assert out.model == SERVED and out.choices[0].text
        chat = api.chat.completions.create(model=model, messages=CHAT["messages"], max_tokens=3)
        assert chat.model == SERVED
    # Omitted (curl, hand-written clients): the served model.
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        response = _post(server, path, body)
        assert response.status_code == 200 and response.json()["model"] == SERVED


REFUSED = [
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("/v1/chat/completions", "tool_choice", "required"),
    ("/v1/chat/completions", "tool_choice", {"type": "function", "function": {"name": "f"}}),
    ("/v1/chat/completions", "functions", [{"name": "f"}]),
    ("/v1/chat/completions", "logprobs", True),
    ("/v1/chat/completions", "top_logprobs", 5),
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ("/v1/chat/completions", "logit_bias", {"5": 10}),
    ("/v1/chat/completions", "frequency_penalty", 0.5),
    ("/v1/chat/completions", "presence_penalty", -1),
    ("/v1/chat/completions", "modalities", ["text", "audio"]),
    ("/v1/chat/completions", "reasoning_effort", "low"),
    ("/v1/completions", "logprobs", 0),  # legacy completions: 0 still returns the sampled token's logprob
    ("/v1/completions", "best_of", 2),
    ("/v1/completions", "echo", True),
    ("/v1/completions", "suffix", "end"),
    ("/v1/completions", "min_p", 0.1),
    ("/v1/completions", "repetition_penalty", 1.2),
    ("/v1/chat/completions", "guided_json", {"type": "object"}),
    ("/v1/completions", "guided_choice", ["yes", "no"]),
    ("/v1/chat/completions", "structured_outputs", {"regex": "[a-z]+"}),
    ("/v1/completions", "allowed_token_ids", [5, 6]),
    ("/v1/chat/completions", "bad_words", ["the"]),
    # Hallmark's own /v1/generate field, never honoured here (issue 35 item 6): refused, not ignored.
    ("/v1/completions", "tenant", "beta"),
    ("/v1/chat/completions", "tenant", "acme"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,param,value", REFUSED)
def test_an_unsupported_parameter_is_a_400_naming_it(server, path, param, value, stream):
    base = CHAT if path.endswith("chat/completions") else COMPLETION
    response = _post(server, path, {**base, param: value, "stream": stream})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["type"] == "invalid_request_error"
    assert error["param"] == param and repr(param) in error["message"]


def test_the_openai_client_gets_bad_request_with_param(api):
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model=SERVED, messages=CHAT["messages"], max_tokens=3, tool_choice="required",
                                    tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert caught.value.param == "tools" and caught.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model=SERVED, prompt="hi", max_tokens=3, logprobs=2)
    assert caught.value.param == "logprobs"
    # n > 1 (supported since issue 24) under acme's deterministic key: every choice would be
    # one text, so the tenant's state refuses it (tests/service/test_diversity.py: diverse keys).
    with pytest.raises(openai.ConflictError) as caught:
        api.chat.completions.create(model=SERVED, messages=CHAT["messages"], max_tokens=3, n=2)
    assert caught.value.code == "n_needs_diverse_key" and "diverse" in caught.value.message


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_n_above_one_with_streaming_is_a_400_naming_n(server, path):
    base = CHAT if path.endswith("chat/completions") else COMPLETION
    response = _post(server, path, {**base, "n": 2, "stream": True})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == "n" and "stream" in error["message"]
    for bad in (0, 17, True, "2"):
        assert _post(server, path, {**base, "n": bad}).status_code == 422


def test_neutral_values_and_supported_parameters_are_accepted(api):
    chat = api.chat.completions.create(
        model=SERVED, messages=CHAT["messages"], max_completion_tokens=3, temperature=0.7, top_p=0.9, seed=4,
        stop=["zz"], user="u-1", metadata={"k": "v"}, store=False, service_tier="auto", parallel_tool_calls=False,
        n=1, logprobs=False, top_logprobs=0, tools=[], tool_choice="none", response_format={"type": "text"},
        frequency_penalty=0, presence_penalty=0.0, logit_bias={}, modalities=["text"])
    assert chat.choices[0].message.content
    chunks = list(api.chat.completions.create(model=SERVED, messages=CHAT["messages"], max_tokens=3, stream=True,
                                              stream_options={"include_usage": True}, tool_choice="auto"))
    assert chunks[-1].usage.completion_tokens == 3
    out = api.completions.create(model=SERVED, prompt="hi", max_tokens=3, n=1, best_of=1, echo=False, suffix="",
                                 frequency_penalty=0.0, user="u-1", stream=False,
                                 extra_body={"min_p": 0, "repetition_penalty": 1, "ignore_eos": False})
    assert out.choices[0].text


@pytest.mark.parametrize("body", [CompletionBody, ChatBody])
def test_every_unsupported_parameter_is_a_field_with_a_neutral_value(body):
    # Declared (so /openapi.json documents it) and accepted at its neutral values.
    fields = set(body.model_fields) & set(UNSUPPORTED)
    assert {"logprobs"} <= fields and "n" not in fields  # n is supported (issue 24)
    base = {"prompt": "hi"} if body is CompletionBody else {"messages": [{"role": "user", "content": "hi"}]}
    for name in fields:
        for neutral in UNSUPPORTED[name]:
            assert body.model_validate({**base, name: neutral}).unsupported_parameter() is None, (name, neutral)
    # A JSON true is not the integer 1, false not 0.
    assert body.model_validate({**base, "min_tokens": True}).unsupported_parameter() == "min_tokens"
    assert body.model_validate({**base, "frequency_penalty": False}).unsupported_parameter() == "frequency_penalty"


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}},
])
def test_a_conversation_with_tool_calls_is_a_400_not_fed_without_them(server, message):
    # The calls would otherwise be dropped silently (the model would see an empty assistant turn).
    messages = [*CHAT["messages"], message, {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    response = _post(server, "/v1/chat/completions", {**CHAT, "messages": messages})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == "messages"
    plain = _post(server, "/v1/chat/completions", {**CHAT, "messages": [*CHAT["messages"], {
        "role": "assistant", "content": "ok", "tool_calls": []}, {"role": "user", "content": "more"}]})
    assert plain.status_code == 200, plain.text
