"""HTTP request bodies (pydantic). Hallmark's own routes refuse unknown fields; the
OpenAI-compatible ones ignore fields they do not use, as OpenAI clients send many."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def _stops(value: str | list[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    watermark: bool = True
    """False asks for unwatermarked output: allowed for admin tokens, or where the deployment
    allows opt-outs (HALLMARK_ALLOW_OPT_OUT); recorded in the ledger either way."""
    tenant: str | None = None
    """Admin tokens only: the tenant to generate for."""

    @property
    def stops(self) -> tuple[str, ...]:
        return _stops(self.stop)


class _OpenAIBase(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)
    watermark: bool = True

    @property
    def stops(self) -> tuple[str, ...]:
        return _stops(self.stop)

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionBody(_OpenAIBase):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt per request")
        return value

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")


class ChatBody(_OpenAIBase):
    messages: list[ChatMessage] = Field(min_length=1)


class DetectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    token_ids: list[int] | None = None
    tenant: str | None = None
    """Admin tokens: the tenant whose keys to test (omit to test every tenant's keys)."""
    threshold: float | None = Field(default=None, gt=0.0, lt=1.0)
    statistic: Literal["auto", "max", "weighted", "routed"] = "auto"
    spans: bool = True
    evidence: bool = False
    """Per-token evidence: character offsets, scored or skipped (and why), score, under the
    key and statistic that decided the result; at most HALLMARK_MAX_EVIDENCE_TOKENS tokens."""
