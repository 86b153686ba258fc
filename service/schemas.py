"""HTTP request bodies (pydantic, strict).

Every field has a type that is not coerced (``"5"`` is not an integer, ``0`` is not a
boolean) and bounds, so that a malformed request gets a 422 before it reaches the engine.
Hallmark's own routes refuse unknown fields. The OpenAI-compatible ones take the fields they
honour, refuse with a 400 naming it any parameter that would change the output but is not
supported (:data:`UNSUPPORTED`, unless it has its neutral value), refuse the one field of
Hallmark's own API they do not honour (``tenant``, :data:`NATIVE_ONLY`), and ignore the rest,
which change nothing in the output (``user``, ``metadata``, ``store``, ``service_tier``,
``stream_options``, ...; OpenAI clients send many). Bounds that depend on the deployment (the token
cap, the prompt length, the model's vocabulary) are enforced by :mod:`service.limits` and
written into the OpenAPI document by :mod:`service.openapi`.

Text fields refuse lone UTF-16 surrogates (JSON ``"\\ud800"``): they are not characters,
no tokenizer can encode them, and no generated text contains them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from keys.tenants import NAME_PATTERN
from watermark.processing import MAX_TEMPERATURE, MIN_TEMPERATURE
from watermark.salt import SALTS

MAX_STOPS = 8
MAX_STOP_CHARS = 200
MAX_SEED = 2**53 - 1
"""JSON-safe integers only: above 2**53 a JSON number is not exact in most clients (and in
the OpenAPI bounds themselves); the engines take any 64-bit seed from other callers."""
MAX_TOP_K = 2**31 - 1
"""A static ceiling; the served model's vocabulary is the real bound (see /openapi.json)."""
MAX_TOKEN_ID = 2**32 - 1
MAX_MESSAGES = 256


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text contains a lone UTF-16 surrogate (such as \\ud800), which is not a "
                         "Unicode character; send valid Unicode text") from None
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
"""A string of Unicode characters (no lone surrogates)."""


def _json_integer(value: Any) -> Any:
    # JSON Schema's integer is any number without a fractional part (313.0 included); strings
    # and booleans stay refused by strict validation.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _int(**bounds: int) -> Any:
    """An integer as JSON Schema defines it (never a string or a boolean), within ``bounds``
    (the bounds sit before the validator so that they appear in the JSON schema)."""
    return Annotated[int, Field(**bounds), BeforeValidator(_json_integer)]


Count = _int(ge=1)
TopK = _int(ge=0, le=MAX_TOP_K)
Seed = _int(ge=0, le=MAX_SEED)
Choices = _int(ge=1, le=SALTS)
TokenId = _int(ge=0, le=MAX_TOKEN_ID)

TenantName = Annotated[str, Field(pattern=f"^{NAME_PATTERN.pattern}$", max_length=64)]
StopText = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Stop = StopText | Annotated[list[StopText], Field(max_length=MAX_STOPS)]


def _temperature(upper: float) -> Any:
    def check(value: float) -> float:
        if not (value == 0.0 or MIN_TEMPERATURE <= value <= upper):
            raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {upper}; "
                             "smaller non-zero values overflow the sampler's float32 arithmetic")
        return value

    schema = {"anyOf": [{"type": "number", "enum": [0]},
                        {"type": "number", "minimum": MIN_TEMPERATURE, "maximum": upper}],
              "description": f"0 for greedy (unwatermarked) decoding, or {MIN_TEMPERATURE} to {upper}."}
    return Annotated[float, AfterValidator(check), WithJsonSchema(schema)]


Temperature = _temperature(MAX_TEMPERATURE)
OpenAITemperature = _temperature(2.0)


def _stops(value: str | list[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: Text = Field(min_length=1)
    max_tokens: Count | None = None
    """Tokens to generate (at most the server's cap; omitted: the server's default)."""
    temperature: Temperature = 1.0
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: TopK = 0
    """0 disables it; at most the model's vocabulary size."""
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool = False
    watermark: bool = True
    """False asks for unwatermarked output: allowed for admin tokens, or where the deployment
    allows opt-outs (HALLMARK_ALLOW_OPT_OUT); recorded in the ledger either way."""
    tenant: TenantName | None = None
    """Admin tokens only: the tenant to generate for."""

    @property
    def stops(self) -> tuple[str, ...]:
        return _stops(self.stop)


UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    # OpenAI's: tool calling, log-probabilities, several choices, structured or non-text output,
    # penalties and biases, and prompt echo/suffix (legacy completions).
    "tools": (None, []), "tool_choice": (None, "none", "auto"), "functions": (None, []),
    "function_call": (None, "none", "auto"), "logprobs": (None, False), "top_logprobs": (None, 0),
    "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "response_format": (None, {"type": "text"}), "logit_bias": (None, {}),
    "frequency_penalty": (None, 0), "presence_penalty": (None, 0), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "web_search_options": (None,),
    "reasoning_effort": (None,), "verbosity": (None,),
    # vLLM's sampling extras.
    "min_p": (None, 0), "repetition_penalty": (None, 1), "min_tokens": (None, 0), "ignore_eos": (None, False),
    "use_beam_search": (None, False), "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
    "guided_grammar": (None,), "structured_outputs": (None,), "allowed_token_ids": (None,), "bad_words": (None, []),
    "prompt_logprobs": (None,), "logits_processors": (None, []),
    # Hallmark's own: /v1/generate's `tenant` picks whom a global admin generates for; ignored here it
    # would generate as someone else than the caller meant (issue 35 item 6), so it is refused.
    "tenant": (None,),
}
NATIVE_ONLY = {"tenant": "a token generates for its own tenant here; a global admin names one on /v1/generate "
                         "({\"tenant\": \"...\"})"}
"""Fields of Hallmark's own API that the OpenAI routes refuse (with why), rather than ignore."""
"""Parameters of OpenAI's (and vLLM's) routes that would change the output and that Hallmark
does not implement, each with the values that ask for nothing (accepted, no effect). Any
other value is refused (400 ``unsupported_parameter`` with ``param``) rather than ignored: a
client that asks for tool calls or log-probabilities must not get a plain completion that
looks like an answer. ``tool_choice: "auto"`` is neutral because no tool can be declared."""


def _same(value: Any, neutral: Any) -> bool:
    # JSON equality without Python's bool/int mixing (true is not 1, false is not 0).
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(value, (list, dict)) or isinstance(neutral, (list, dict)):
        return json.dumps(value, sort_keys=True) == json.dumps(neutral, sort_keys=True)
    return value == neutral


def _unsupported(name: str) -> Any:
    accepted = " or ".join(json.dumps(v) for v in UNSUPPORTED[name])
    return Field(default=None, description=f"Not supported: {accepted} only (no effect); any other value "
                                           "gets 400 with code `unsupported_parameter` and `param` naming it.")


class _OpenAIBase(BaseModel):
    # The document states the one rule across fields that a schema can: `n` > 1 only
    # without streaming (a client or a fuzzer reading /openapi.json then knows the 400).
    model_config = ConfigDict(extra="ignore", strict=True, json_schema_extra={
        "if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
        "then": {"properties": {"n": {"anyOf": [{"const": 1}, {"type": "null"}]}}}})

    model: Text | None = Field(default=None, max_length=256)
    """One of the ids /v1/models lists (omitted: the served model); another gets 404
    `model_not_found`."""
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    temperature: OpenAITemperature | None = None
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool = False
    watermark: bool = True
    n: Choices | None = None
    """Choices to generate (1-16): each is its own generation (ledger entry, receipt) under
    its own salt, so they differ; needs the tenant's key in mode `diverse` (409 otherwise) and
    no streaming (400)."""
    logprobs: Any = _unsupported("logprobs")
    logit_bias: Any = _unsupported("logit_bias")
    frequency_penalty: Any = _unsupported("frequency_penalty")
    presence_penalty: Any = _unsupported("presence_penalty")
    min_p: Any = _unsupported("min_p")
    repetition_penalty: Any = _unsupported("repetition_penalty")
    min_tokens: Any = _unsupported("min_tokens")
    ignore_eos: Any = _unsupported("ignore_eos")
    use_beam_search: Any = _unsupported("use_beam_search")
    guided_json: Any = _unsupported("guided_json")
    guided_regex: Any = _unsupported("guided_regex")
    guided_choice: Any = _unsupported("guided_choice")
    guided_grammar: Any = _unsupported("guided_grammar")
    structured_outputs: Any = _unsupported("structured_outputs")
    allowed_token_ids: Any = _unsupported("allowed_token_ids")
    bad_words: Any = _unsupported("bad_words")
    prompt_logprobs: Any = _unsupported("prompt_logprobs")
    logits_processors: Any = _unsupported("logits_processors")
    tenant: Any = Field(default=None, description="Not accepted (null only): " + NATIVE_ONLY["tenant"] +
                        "; any other value gets 400 `unsupported_parameter`.")

    def unsupported_parameter(self) -> str | None:
        """The first parameter of :data:`UNSUPPORTED` sent with a value other than a neutral one."""
        for name in type(self).model_fields:
            if name in UNSUPPORTED and not any(_same(getattr(self, name), v) for v in UNSUPPORTED[name]):
                return name
        return None

    @property
    def stops(self) -> tuple[str, ...]:
        return _stops(self.stop)

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class CompletionBody(_OpenAIBase):
    prompt: Annotated[Text, Field(min_length=1)] | Annotated[list[Annotated[Text, Field(min_length=1)]],
                                                             Field(min_length=1, max_length=1)] \
        | TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
    """One prompt: a string, or token ids (OpenAI's forms; a list holds exactly one)."""
    best_of: Any = _unsupported("best_of")
    echo: Any = _unsupported("echo")
    suffix: Any = _unsupported("suffix")

    @property
    def prompt_text(self) -> str | None:
        if isinstance(self.prompt, str):
            return self.prompt
        if isinstance(self.prompt[0], str):
            return self.prompt[0]
        return None

    @property
    def prompt_ids(self) -> tuple[int, ...] | None:
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], str):
            return None
        return tuple(self.prompt[0] if isinstance(self.prompt[0], list) else self.prompt)


class TextPart(BaseModel):
    """A chat content part; this text-only model takes `text` parts only."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Text | list[TextPart] | None = None
    tool_calls: Any = Field(default=None, description="Not supported: null or [] only (no tool can be declared); "
                                                      "any other value gets 400 `unsupported_parameter`.")
    function_call: Any = Field(default=None, description="Not supported: null only; any other value gets 400 "
                                                         "`unsupported_parameter`.")

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatBody(_OpenAIBase):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: Any = _unsupported("tools")
    tool_choice: Any = _unsupported("tool_choice")
    functions: Any = _unsupported("functions")
    function_call: Any = _unsupported("function_call")
    top_logprobs: Any = _unsupported("top_logprobs")
    response_format: Any = _unsupported("response_format")
    audio: Any = _unsupported("audio")
    modalities: Any = _unsupported("modalities")
    prediction: Any = _unsupported("prediction")
    web_search_options: Any = _unsupported("web_search_options")
    reasoning_effort: Any = _unsupported("reasoning_effort")
    verbosity: Any = _unsupported("verbosity")

    def unsupported_parameter(self) -> str | None:
        """As the base class, and an assistant message's tool or function calls: this server
        declares no tools, and dropping the calls would feed the model a different conversation
        than the client sent (``param``: ``messages``)."""
        name = super().unsupported_parameter()
        if name is None and any(m.tool_calls not in (None, []) or m.function_call is not None for m in self.messages):
            return "messages"
        return name


class DetectBody(BaseModel):
    """Exactly one of ``text`` and ``token_ids``."""

    # Attribute docstrings become the fields' descriptions in /openapi.json (and /docs).
    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True, json_schema_extra={
        "oneOf": [{"required": ["text"]}, {"required": ["token_ids"]}]})

    # Emptiness is refused by service.detect_input (422 `empty_input`, a message saying what to
    # send); the schema says so here without a second, vaguer check of its own.
    text: Text = Field(default=None, json_schema_extra={"minLength": 1, "pattern": r"\S", "description": (
        "Text to score, tokenized with the key's model tokenizer (above the server's "
        "max_detect_chars: 413; empty or only whitespace: 422 `empty_input`).")})
    token_ids: list[TokenId] = Field(default=None, json_schema_extra={"minItems": 1})
    """Token ids to score (instead of `text`), each in the served model's vocabulary (422
    `token_out_of_vocabulary` otherwise; an empty list: 422 `empty_input`)."""
    tenant: TenantName | None = None
    """Admin tokens: the tenant whose keys to test (omit to test every tenant's keys). A
    tenant token may name only its own tenant (403 otherwise)."""
    threshold: float | None = Field(default=None, gt=0.0, lt=1.0)
    """The text is reported watermarked when its global p-value is at most this (default 1e-6)."""
    statistic: Literal["auto", "max", "weighted", "routed"] = "auto"
    """Dual-key statistic. `auto`: `routed` for keys with a keyed acceptance coin; otherwise
    both `max` and `weighted` under one weighted Bonferroni correction. `max`, `weighted`
    or `routed` force one; `routed` needs keys with a keyed acceptance coin (409
    `statistic_unavailable` otherwise). Single-key (`gumbel`) keys ignore it."""
    test: Literal["auto", "sum", "trgof"] = "auto"
    """Whole-text test: `auto` combines the sum and Tr-GoF (edit-robust) with the spans under
    one weighted Bonferroni correction; `sum` or `trgof` alone."""
    spans: bool = True
    """Localise watermarked spans (token and, for text, character offsets)."""
    normalize: bool = True
    """Text input: undo tokenisation attacks (NFKC, zero-width and bidi controls, homoglyphs,
    whitespace runs) before tokenising; the response's `normalization` says what changed."""
    evidence: bool = False
    """Per-token evidence: character offsets, scored or skipped (and why), score, under the
    key and statistic that decided the result; at most HALLMARK_MAX_EVIDENCE_TOKENS tokens."""

    @model_validator(mode="after")
    def _one_input(self) -> "DetectBody":
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("give exactly one of 'text' and 'token_ids'")
        return self


class PublicDetectBody(BaseModel):
    """The public check: a text and nothing else (fixed settings: the default threshold,
    statistic and test, normalisation on)."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)

    text: Text = Field(min_length=1)
    """Text to check (above the server's public_max_chars: 413; under public_min_tokens
    tokens: "too short to say")."""
