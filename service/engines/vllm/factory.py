"""Building the `vllm` engine from settings: in-process or remote, one factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.model_paths import BUNDLED_DRAFT, resolve_model_path
from service.engines.vllm.engine import VLLMEngine


class VLLMSettings(BaseSettings):
    """How to reach vLLM. From ``HALLMARK_VLLM_*`` variables or built explicitly (the CLI's
    ``--model`` and ``--vllm-url`` override them)."""

    model_config = SettingsConfigDict(env_prefix="HALLMARK_VLLM_", extra="ignore", frozen=True,
                                      env_ignore_empty=True)

    model: str | None = None
    """In-process: a checkpoint directory, a Hugging Face id in the local cache, or a bundled
    model name. Remote: the served model name (default: the server's first model). None on a
    CPU-only machine means the bundled dense draft model."""

    url: str | None = None
    """A remote ``vllm serve`` base URL (``http://host:8000``); None runs vLLM in-process."""

    api_key: SecretStr | None = Field(default=None, repr=False, exclude=True)
    """The remote server's ``--api-key``, sent as a bearer token."""

    allow_insecure_http: bool = False
    """Allow a non-loopback remote URL over plain http or without an API key (a private
    network the operator vouches for). Off: such a URL is refused at start."""

    tokenizer: str | None = None
    """Where the gateway loads the tokenizer from (default: ``model``). Remote mode needs a
    local copy of the served model's tokenizer."""

    dtype: str = "auto"
    """In-process: vLLM's ``--dtype``."""

    max_model_len: int | None = Field(default=None, ge=16)
    """In-process: vLLM's ``--max-model-len`` (default: the model's)."""

    enforce_eager: bool | None = None
    """In-process: skip vLLM's graph compilation (default: on for CPU, where it saves
    most of the start-up time of a small model)."""

    cpu_kv_cache_gib: int = Field(default=1, ge=1)
    """In-process on vLLM's CPU build: KV-cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``)."""

    engine_options: dict[str, Any] = Field(default_factory=dict)
    """In-process: further ``AsyncEngineArgs`` fields, for example ``{"tensor_parallel_size": 2}``."""

    @model_validator(mode="after")
    def _remote_has_no_engine_options(self) -> "VLLMSettings":
        if self.url is not None and self.engine_options:
            raise ValueError("engine_options configure an in-process engine; a remote server takes "
                             "its options on its own `vllm serve` command line")
        return self


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def default_model() -> str:
    """The model an in-process engine loads when none is named: the bundled dense draft
    model on a CPU-only machine (vLLM's CPU build has no sparse attention)."""
    if _cuda_available():
        raise ValueError("name the model for the vllm engine (--model or HALLMARK_VLLM_MODEL); the "
                         "bundled default is for CPU-only machines")
    path = Path(resolve_model_path(BUNDLED_DRAFT))
    if not (path / "config.json").exists():
        raise ValueError(f"the bundled model {BUNDLED_DRAFT} is not installed at {path}; name a model "
                         "with --model or HALLMARK_VLLM_MODEL")
    return BUNDLED_DRAFT


def vllm_settings_from(settings: Any) -> VLLMSettings:
    """:class:`VLLMSettings` from the gateway's settings (or any object with ``model`` and
    ``vllm_url``); the rest comes from ``HALLMARK_VLLM_*``. The gateway's default model,
    ``bundled``, names the local engine's sparse-MLA pair, which vLLM's CPU build cannot
    run: it means "vLLM's default" here."""
    if isinstance(settings, VLLMSettings):
        return settings
    overrides: dict[str, Any] = {}
    model = getattr(settings, "model", None)
    if model and model != "bundled":
        overrides["model"] = model
    url = getattr(settings, "vllm_url", None)
    if url:
        overrides["url"] = url
    return VLLMSettings(**overrides)


def create_vllm_engine(settings: Any = None) -> VLLMEngine:
    """The `vllm` engine the settings describe (not started: ``await engine.start()``).

    ``settings``: a :class:`VLLMSettings`, the gateway's ``ServiceSettings`` (its ``model``
    and ``vllm_url``), or None (the environment alone).
    """
    from service.tokenization import load_tokenizer

    settings = vllm_settings_from(settings) if settings is not None else VLLMSettings()
    if settings.url is not None:
        from service.engines.vllm.remote import RemoteBackend

        backend = RemoteBackend(settings.url, model_name=settings.model,
                                api_key=settings.api_key.get_secret_value() if settings.api_key else None,
                                allow_insecure_http=settings.allow_insecure_http)
        source = settings.tokenizer or settings.model

        def remote_tokenizer():
            # The served name is known once start() asked the server.
            return load_tokenizer(source or backend.model_name)

        return VLLMEngine(backend, remote_tokenizer)

    from service.engines.vllm.inprocess import InProcessBackend

    name = settings.model or default_model()
    path = resolve_model_path(name)
    eager = settings.enforce_eager if settings.enforce_eager is not None else not _cuda_available()
    backend = InProcessBackend(path, model_name=name, dtype=settings.dtype, max_model_len=settings.max_model_len,
                               enforce_eager=eager, cpu_kv_cache_gib=settings.cpu_kv_cache_gib,
                               engine_options=settings.engine_options)
    return VLLMEngine(backend, lambda: load_tokenizer(settings.tokenizer or name))
