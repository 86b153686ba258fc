"""One factory for the engine family."""

from __future__ import annotations

from service.engines.base import Engine
from service.settings import ServiceSettings


def create_engine(settings: ServiceSettings) -> Engine:
    if settings.engine == "local":
        from service.engines.local.engine import create_local_engine

        return create_local_engine(settings)
    if settings.engine == "vllm":
        from service.engines.vllm.factory import create_vllm_engine

        return create_vllm_engine(settings)
    raise ValueError(f"unknown engine: {settings.engine!r}; expected one of ['local', 'vllm']")
